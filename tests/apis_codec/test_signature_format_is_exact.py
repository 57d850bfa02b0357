"""A signature is the whole annotation value: nothing may trail it, not even a newline (`$` allows one)."""

from __future__ import annotations

import pytest

from apis.signing import SignatureError, sign_allocation, signature_key_id, verify_allocation
from tests.signing_keys import legacy_v1_signature, signing_key, verifying

KEY = signing_key("cluster-key-for-tests")
LEGACY_KEY = b"cluster-key-for-tests"


@pytest.mark.parametrize("tail", ["\n", "\r\n", " ", "\n\n"])
def test_a_v2_signature_with_anything_after_it_is_refused_as_an_unknown_format(tail: str) -> None:
    signature = sign_allocation(KEY, pod_uid="uid-1", node_name="n1", annotation="{}")
    verify_allocation(verifying(KEY), pod_uid="uid-1", node_name="n1", annotation="{}", signature=signature)

    with pytest.raises(SignatureError, match="unknown format"):
        verify_allocation(verifying(KEY), pod_uid="uid-1", node_name="n1", annotation="{}", signature=signature + tail)
    assert signature_key_id(signature + tail) == ""


@pytest.mark.parametrize("tail", ["\n", "\r\n", " "])
def test_a_v1_signature_with_anything_after_it_is_refused_as_an_unknown_format(tail: str) -> None:
    keys = verifying(KEY, legacy_key=LEGACY_KEY)
    signature = legacy_v1_signature(LEGACY_KEY, pod_uid="uid-1", node_name="n1", annotation="{}")
    verify_allocation(keys, pod_uid="uid-1", node_name="n1", annotation="{}", signature=signature)

    with pytest.raises(SignatureError, match="unknown format"):
        verify_allocation(keys, pod_uid="uid-1", node_name="n1", annotation="{}", signature=signature + tail)
    assert signature_key_id(signature + tail) == ""
