"""The allocation signature: proof that fgpu's scheduler wrote an allocation.

Anyone who can edit a pod can write a device-allocated annotation. The node
refuses one that the scheduler's key did not sign, so a pod cannot give itself
a GPU, copy another pod's allocation, or take an allocation made for another
node.

v2, the one the scheduler writes: Ed25519 over an unambiguous encoding of
(pod UID, node name, exact annotation string), written as

    v2:<key id>:<signature>     e.g. v2:3f2a9c0d11b4e857:Zm9v...  (86 base64url characters)

The key id is the first 8 bytes of SHA-256 of the raw public key, in hex; the
signature is its 64 bytes in base64url without padding. Only the scheduler
holds the private key (`SigningKey`); nodes hold public keys (`VerifyingKeys`),
several during a rotation, chosen by the key id. A compromised node therefore
yields nothing that signs, and a new key can be added to every node before the
scheduler switches to it (docs/deploy.md, "Rotating the signing key").

v1, the one before: HMAC-SHA256 with one cluster key on every node,
"v1:<64 hex digits>". It is verified only where the verifier is given that key
as its legacy key (the upgrade window) and refused everywhere else.

Each field is length-prefixed, so no choice of field contents can make two
different triples encode to the same message; the versions differ in their
domain prefix, so no signature of one is a signature of the other.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NewType, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from apis import names
from apis.allocation import Allocation, decode_allocation, encode_allocation

#: 16 hex digits: the first 8 bytes of SHA-256 of the raw Ed25519 public key.
KeyID = NewType("KeyID", str)

_V1_DOMAIN = b"fgpu.io/allocation-signature/v1\x00"
_V2_DOMAIN = b"fgpu.io/allocation-signature/v2\x00"
# Matched with fullmatch: `$` also matches before a trailing newline, so "<signature>\n" would verify.
_V1_FORMAT = re.compile(r"v1:[0-9a-f]{64}")
_V2_FORMAT = re.compile(r"v2:(?P<key_id>[0-9a-f]{16}):(?P<signature>[A-Za-z0-9_-]{86})")
_V2_EXPECTED = "v2:<16 hex digits of key id>:<86 base64url characters>"
_SEED_BYTES = 32


class SignatureError(ValueError):
    """A missing, malformed or non-matching allocation signature, or an unusable key."""


class SigningKeyError(SignatureError):
    """A key file is missing, unreadable, empty or not a key of the expected kind."""


def key_id_of(key: Ed25519PublicKey) -> KeyID:
    """The key id of an Ed25519 public key, as signatures carry it."""
    raw = key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return KeyID(hashlib.sha256(raw).hexdigest()[:16])


@dataclass(frozen=True)
class PublicKey:
    """One Ed25519 public key a node accepts signatures of; equal when the key ids are."""

    key_id: KeyID
    key: Ed25519PublicKey = field(repr=False, compare=False)

    @classmethod
    def of(cls, key: Ed25519PublicKey) -> PublicKey:
        return cls(key_id=key_id_of(key), key=key)


@dataclass(frozen=True)
class VerifyingKeys:
    """What a node checks signatures with: public keys by key id, and the v1 HMAC key during the upgrade window.

    `legacy_key` None means v1 signatures are refused.
    """

    keys: tuple[PublicKey, ...] = ()
    legacy_key: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.legacy_key is not None and not self.legacy_key:
            # An empty HMAC key would let anyone compute a valid v1 signature.
            raise SigningKeyError("the legacy v1 signing key is empty; give None to refuse v1 signatures")

    @property
    def key_ids(self) -> tuple[KeyID, ...]:
        return tuple(k.key_id for k in self.keys)

    def find(self, key_id: str) -> PublicKey | None:
        return next((k for k in self.keys if k.key_id == key_id), None)

    def with_keys(self, *more: PublicKey) -> VerifyingKeys:
        """These keys plus `more` (a key already present is kept once)."""
        added = tuple(k for i, k in enumerate(more) if self.find(k.key_id) is None and k not in more[:i])
        return VerifyingKeys(keys=self.keys + added, legacy_key=self.legacy_key)


@dataclass(frozen=True)
class SigningKey:
    """The scheduler's Ed25519 private key; equal when the key ids are.

    A fixed key is also its own `SchedulerKeys`: it signs with itself and
    verifies its own signatures only.
    """

    key_id: KeyID
    key: Ed25519PrivateKey = field(repr=False, compare=False)

    @classmethod
    def of(cls, key: Ed25519PrivateKey) -> SigningKey:
        return cls(key_id=key_id_of(key.public_key()), key=key)

    @classmethod
    def generate(cls) -> SigningKey:
        return cls.of(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> SigningKey:
        """The key whose 32-byte private seed is `seed` (deterministic: tests and known-answer checks)."""
        if len(seed) != _SEED_BYTES:
            raise SigningKeyError(f"an Ed25519 seed is {_SEED_BYTES} bytes, got {len(seed)}")
        return cls.of(Ed25519PrivateKey.from_private_bytes(seed))

    @property
    def public(self) -> PublicKey:
        return PublicKey(key_id=self.key_id, key=self.key.public_key())

    def signing_key(self) -> SigningKey:
        return self

    def verifying_keys(self) -> VerifyingKeys:
        return VerifyingKeys(keys=(self.public,))


class SchedulerKeys(Protocol):
    """The scheduler's keys as of now: a fixed `SigningKey`, or `apis.keyfiles.SchedulerKeyFiles` (re-read on change)."""

    def signing_key(self) -> SigningKey:
        """The key to sign with now; raises SigningKeyError when there is none."""
        ...

    def verifying_keys(self) -> VerifyingKeys:
        """The keys that bound pods' signatures are checked with: the signing key's and any configured."""
        ...


def sign_allocation(key: SigningKey, *, pod_uid: str, node_name: str, annotation: str) -> str:
    """The v2 signature of `annotation` for pod `pod_uid` on node `node_name`."""
    signature = key.key.sign(_message(_V2_DOMAIN, pod_uid, node_name, annotation))
    encoded = base64.urlsafe_b64encode(signature).rstrip(b"=").decode("ascii")
    return f"v2:{key.key_id}:{encoded}"


def verify_allocation(keys: VerifyingKeys, *, pod_uid: str, node_name: str, annotation: str, signature: str) -> None:
    """Returns when `signature` is one for this pod, node and annotation; raises SignatureError otherwise."""
    if not signature:
        raise SignatureError(
            f"pod {pod_uid}: allocation is not signed (no {names.ALLOCATION_SIGNATURE} annotation); "
            "only allocations made by the fgpu scheduler are accepted"
        )
    if signature.startswith("v1:"):
        _verify_v1(keys, pod_uid=pod_uid, node_name=node_name, annotation=annotation, signature=signature)
        return
    match = _V2_FORMAT.fullmatch(signature)
    if match is None:
        raise SignatureError(
            f"pod {pod_uid}: {names.ALLOCATION_SIGNATURE}={_shorten(signature)!r} has an unknown format; "
            f"expected {_V2_EXPECTED}"
        )
    key_id = match["key_id"]
    public = keys.find(key_id)
    if public is None:
        known = ", ".join(keys.key_ids) or "none"
        raise SignatureError(
            f"pod {pod_uid}: allocation is signed with key {key_id}, which is not one of the verifying keys "
            f"here ({known}); if it is the scheduler's current key, add its public key to every node's "
            "verifyingKeys (`fgpuctl keys public`, docs/deploy.md \"Rotating the signing key\"); if it was "
            "retired, delete the pod so that it is scheduled and signed again"
        )
    try:
        public.key.verify(_decode(match["signature"]), _message(_V2_DOMAIN, pod_uid, node_name, annotation))
    except InvalidSignature:
        raise SignatureError(
            f"allocation signature does not match pod {pod_uid} on node {node_name}: the "
            f"{names.DEVICE_ALLOCATED} annotation or the signature was changed, or it was made for another "
            "pod or node"
        ) from None


def allocation_annotations(
    key: SigningKey, *, pod_uid: str, node_name: str, allocation: Allocation
) -> dict[str, str]:
    """The pod annotations that carry `allocation` to node `node_name`, signed."""
    annotation = encode_allocation(allocation)
    return {
        names.DEVICE_ALLOCATED: annotation,
        names.ALLOCATION_SIGNATURE: sign_allocation(
            key, pod_uid=pod_uid, node_name=node_name, annotation=annotation
        ),
        names.ALLOCATION_NODE: node_name,
    }


def verify_pod_annotations(
    keys: VerifyingKeys, *, pod_uid: str, node_name: str, annotations: Mapping[str, str]
) -> Allocation | None:
    """The allocation a pod carries for this node, once its signature checks out.

    None when the pod carries no allocation. Raises SignatureError when the
    signature is missing, malformed, made with an unknown key or does not
    match, and AllocationError when a correctly signed value cannot be read.
    """
    annotation = verified_annotation(keys, pod_uid=pod_uid, node_name=node_name, annotations=annotations)
    return None if annotation is None else decode_allocation(annotation)


def verified_annotation(
    keys: VerifyingKeys, *, pod_uid: str, node_name: str, annotations: Mapping[str, str]
) -> str | None:
    """`verify_pod_annotations` without the decoding: the allocation annotation once its signature checks out.

    For a caller that decoded the annotation already (the node's hook decides whether it lists a
    GPU first) and would otherwise read the same JSON twice per container.
    """
    annotation = annotations.get(names.DEVICE_ALLOCATED)
    if annotation is None:
        return None
    target = annotations.get(names.ALLOCATION_NODE)
    if target is not None and target != node_name:
        # Said apart from a plain mismatch because it is the one case we can name.
        raise SignatureError(
            f"pod {pod_uid}: allocation is for node {target!r} ({names.ALLOCATION_NODE}), not this node "
            f"{node_name!r}; the pod must be scheduled again"
        )
    verify_allocation(
        keys,
        pod_uid=pod_uid,
        node_name=node_name,
        annotation=annotation,
        signature=annotations.get(names.ALLOCATION_SIGNATURE, ""),
    )
    return annotation


def signature_key_id(signature: str) -> str:
    """Which key made `signature`: its key id for v2, "v1" for an HMAC one, "" when unsigned or unreadable."""
    match = _V2_FORMAT.fullmatch(signature)
    if match is not None:
        return match["key_id"]
    return "v1" if _V1_FORMAT.fullmatch(signature) else ""


def _verify_v1(keys: VerifyingKeys, *, pod_uid: str, node_name: str, annotation: str, signature: str) -> None:
    if keys.legacy_key is None:
        raise SignatureError(
            f"pod {pod_uid}: allocation carries a v1 (HMAC) signature, and v1 is refused here since the "
            "upgrade window is over (no legacySigningKey); delete the pod so that fgpu-scheduler places and "
            "signs it again, or, during the upgrade window only, set legacySigningKey to the old cluster key "
            "(docs/deploy.md)"
        )
    if not _V1_FORMAT.fullmatch(signature):
        raise SignatureError(
            f"pod {pod_uid}: {names.ALLOCATION_SIGNATURE}={_shorten(signature)!r} has an unknown format; "
            f"expected {_V2_EXPECTED} (or v1:<64 lowercase hex digits> during the upgrade window)"
        )
    mac = hmac.new(keys.legacy_key, _message(_V1_DOMAIN, pod_uid, node_name, annotation), hashlib.sha256)
    if not hmac.compare_digest(f"v1:{mac.hexdigest()}".encode("ascii"), signature.encode("ascii")):
        # HMAC cannot tell a changed annotation from a copied or foreign one.
        raise SignatureError(
            f"allocation signature does not match pod {pod_uid} on node {node_name}: the "
            f"{names.DEVICE_ALLOCATED} annotation was changed, was made for another pod or node, "
            "or was signed with another cluster key"
        )


def _message(domain: bytes, pod_uid: str, node_name: str, annotation: str) -> bytes:
    parts = [domain]
    for text in (pod_uid, node_name, annotation):
        data = text.encode("utf-8", "surrogatepass")
        parts.append(struct.pack(">Q", len(data)))
        parts.append(data)
    return b"".join(parts)


def _decode(text: str) -> bytes:
    """The signature bytes; b"" (which no key verifies) for a non-canonical spelling.

    The last of the 86 characters carries 2 unused bits: without this check
    four different strings would be one signature.
    """
    try:
        data = base64.urlsafe_b64decode(text + "==")
    except (binascii.Error, ValueError):  # unreachable after the format check; kept as a refusal
        return b""
    return data if base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii") == text else b""


def _shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
