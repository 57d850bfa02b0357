"""Ed25519 keys for tests: the same name gives the same key in every run, and their files."""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

from apis.keyfiles import private_pem, public_pem
from apis.signing import SigningKey, VerifyingKeys


def signing_key(name: str) -> SigningKey:
    """The key whose seed is SHA-256 of `name`: stable across runs, different per name."""
    return SigningKey.from_seed(hashlib.sha256(name.encode()).digest())


def verifying(*keys: SigningKey, legacy_key: bytes | None = None) -> VerifyingKeys:
    """What a node holds that accepts signatures of `keys` (and v1 ones with `legacy_key`)."""
    return VerifyingKeys(keys=tuple(k.public for k in keys), legacy_key=legacy_key)


def write_signing_key(path: str, key: SigningKey) -> str:
    with open(path, "wb") as f:
        f.write(private_pem(key))
    os.chmod(path, 0o600)
    return path


def write_verifying_keys(directory: str, *keys: SigningKey) -> str:
    """A verifyingKeys directory as a ConfigMap volume would hold it: one `<key id>.pub` per key."""
    os.makedirs(directory, exist_ok=True)
    for key in keys:
        with open(os.path.join(directory, f"{key.key_id}.pub"), "wb") as f:
            f.write(public_pem(key.public))
    return directory


def legacy_v1_signature(key: bytes, *, pod_uid: str, node_name: str, annotation: str) -> str:
    """What fgpu wrote before v2 (HMAC-SHA256, "v1:<hex>"), rebuilt here so tests can make old pods.

    tests/apis_codec/test_signing.py pins it to a signature the old code made.
    """
    message = [b"fgpu.io/allocation-signature/v1\x00"]
    for text in (pod_uid, node_name, annotation):
        data = text.encode("utf-8", "surrogatepass")
        message += [struct.pack(">Q", len(data)), data]
    return "v1:" + hmac.new(key, b"".join(message), hashlib.sha256).hexdigest()
