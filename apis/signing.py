"""The allocation signature: proof that fgpu's scheduler wrote an allocation.

Anyone who can edit a pod can write a device-allocated annotation. The node
refuses one that nobody holding the cluster key signed, so a pod cannot give
itself a GPU, copy another pod's allocation, or take an allocation made for
another node.

The signature is HMAC-SHA256 with the cluster key over an unambiguous
encoding of (pod UID, node name, exact annotation string), written as
"v1:<64 hex digits>". Each field is length-prefixed, so no choice of field
contents can make two different triples encode to the same message.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import struct
from collections.abc import Mapping

from apis import names
from apis.allocation import Allocation, decode_allocation, encode_allocation

_VERSION = "v1"
_DOMAIN = b"fgpu.io/allocation-signature/v1\x00"
_FORMAT = re.compile(r"^v1:[0-9a-f]{64}$")


class SignatureError(ValueError):
    """A missing, malformed or non-matching allocation signature, or an unusable key."""


class SigningKeyError(SignatureError):
    """The cluster key file is missing, unreadable or empty."""


def load_key(path: str) -> bytes:
    """Reads the cluster key from `path`, without its trailing newline.

    Raises SigningKeyError when the file is missing, unreadable or empty,
    because signing with an empty key would accept forgeries.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError as exc:
        raise SigningKeyError(
            f"allocation signing key file {path} does not exist; create it with "
            f"`head -c 32 /dev/urandom | base64 > {path}` and mount the same key on every node"
        ) from exc
    except OSError as exc:
        raise SigningKeyError(f"allocation signing key file {path} cannot be read: {exc.strerror}") from exc
    key = data.rstrip(b"\r\n")
    if not key:
        raise SigningKeyError(
            f"allocation signing key file {path} is empty; write a random key into it, e.g. "
            f"`head -c 32 /dev/urandom | base64 > {path}`"
        )
    return key


def sign_allocation(key: bytes, *, pod_uid: str, node_name: str, annotation: str) -> str:
    """The signature of `annotation` for pod `pod_uid` on node `node_name`, "v1:<hex>"."""
    mac = hmac.new(_checked_key(key), _message(pod_uid, node_name, annotation), hashlib.sha256)
    return f"{_VERSION}:{mac.hexdigest()}"


def verify_allocation(key: bytes, *, pod_uid: str, node_name: str, annotation: str, signature: str) -> None:
    """Returns when `signature` is the one for this pod, node and annotation; raises SignatureError otherwise."""
    if not signature:
        raise SignatureError(
            f"pod {pod_uid}: allocation is not signed (no {names.ALLOCATION_SIGNATURE} annotation); "
            "only allocations made by the fgpu scheduler with the cluster key are accepted"
        )
    if not _FORMAT.match(signature):
        raise SignatureError(
            f"pod {pod_uid}: {names.ALLOCATION_SIGNATURE}={_shorten(signature)!r} has an unknown format; "
            f"expected {_VERSION}:<64 lowercase hex digits>"
        )
    expected = sign_allocation(key, pod_uid=pod_uid, node_name=node_name, annotation=annotation)
    if not hmac.compare_digest(expected.encode("ascii"), signature.encode("ascii")):
        # HMAC cannot tell a changed annotation from a copied or foreign one.
        raise SignatureError(
            f"allocation signature does not match pod {pod_uid} on node {node_name}: the "
            f"{names.DEVICE_ALLOCATED} annotation was changed, was made for another pod or node, "
            "or was signed with another cluster key"
        )


def allocation_annotations(key: bytes, *, pod_uid: str, node_name: str, allocation: Allocation) -> dict[str, str]:
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
    key: bytes, *, pod_uid: str, node_name: str, annotations: Mapping[str, str]
) -> Allocation | None:
    """The allocation a pod carries for this node, once its signature checks out.

    None when the pod carries no allocation. Raises SignatureError when the
    signature is missing, malformed or does not match, and AllocationError
    when a correctly signed value cannot be read.
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
        key,
        pod_uid=pod_uid,
        node_name=node_name,
        annotation=annotation,
        signature=annotations.get(names.ALLOCATION_SIGNATURE, ""),
    )
    return decode_allocation(annotation)


def _message(pod_uid: str, node_name: str, annotation: str) -> bytes:
    parts = [_DOMAIN]
    for field in (pod_uid, node_name, annotation):
        data = field.encode("utf-8", "surrogatepass")
        parts.append(struct.pack(">Q", len(data)))
        parts.append(data)
    return b"".join(parts)


def _checked_key(key: bytes) -> bytes:
    if not key:
        raise SigningKeyError("allocation signing key is empty; load it with apis.signing.load_key")
    return key


def _shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
