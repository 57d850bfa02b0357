"""The allocation signature: a node accepts only what the scheduler's key signed, for this pod and node."""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import assume, given
from hypothesis import strategies as st

from apis import names
from apis.allocation import Allocation, AllocationError, GPUShare, encode_allocation
from apis.signing import (
    SignatureError,
    SigningKey,
    SigningKeyError,
    VerifyingKeys,
    allocation_annotations,
    sign_allocation,
    signature_key_id,
    verify_allocation,
    verify_pod_annotations,
)
from tests.apis_codec.strategies import allocations
from tests.signing_keys import legacy_v1_signature, signing_key, verifying

KEY = signing_key("cluster-key-for-tests")
KEYS = verifying(KEY)
OTHER = signing_key("another-scheduler")
ALLOCATION = Allocation(
    gpus=(GPUShare(minor=0, uuid="GPU-0", core_percent=50, memory_bytes=20 * 2**30, memory_ratio_percent=50),)
)
seeds = st.binary(min_size=32, max_size=32)

#: Made by fgpu before v2 (apis/signing.py at 4d18507) with the HMAC key below, for pod uid-1 on n1.
LEGACY_KEY = b"cluster-key-for-tests"
LEGACY_ANNOTATION = '{"gpu":[]}'
LEGACY_SIGNATURE = "v1:fa90df634242679f4556c1c47cc4fd29e1f79d159825fb2d91b35bef41f0dca2"


def test_signature_is_version_two_with_the_key_id_and_a_64_byte_ed25519_signature() -> None:
    signature = sign_allocation(KEY, pod_uid="uid-1", node_name="n1", annotation="{}")

    version, key_id, encoded = signature.split(":")
    assert (version, key_id) == ("v2", KEY.key_id)
    assert len(base64.urlsafe_b64decode(encoded + "==")) == 64


def test_the_key_id_is_the_first_8_bytes_of_sha256_of_the_raw_public_key() -> None:
    raw = KEY.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    assert KEY.key_id == hashlib.sha256(raw).hexdigest()[:16]
    assert KEY.public.key_id == KEY.key_id != OTHER.key_id


def test_annotations_carry_the_canonical_allocation_its_signature_and_node() -> None:
    annotations = allocation_annotations(KEY, pod_uid="uid-1", node_name="n1", allocation=ALLOCATION)

    assert annotations == {
        names.DEVICE_ALLOCATED: encode_allocation(ALLOCATION),
        names.ALLOCATION_SIGNATURE: sign_allocation(
            KEY, pod_uid="uid-1", node_name="n1", annotation=encode_allocation(ALLOCATION)
        ),
        names.ALLOCATION_NODE: "n1",
    }


def test_pod_annotations_signed_for_this_pod_and_node_give_back_the_allocation() -> None:
    annotations = allocation_annotations(KEY, pod_uid="uid-1", node_name="n1", allocation=ALLOCATION)

    got = verify_pod_annotations(KEYS, pod_uid="uid-1", node_name="n1", annotations={**annotations, "other": "x"})

    assert got == ALLOCATION


def test_a_pod_without_an_allocation_has_nothing_to_verify() -> None:
    assert verify_pod_annotations(KEYS, pod_uid="uid-1", node_name="n1", annotations={"a": "b"}) is None


def test_an_unsigned_allocation_is_refused_as_not_signed() -> None:
    annotations = {names.DEVICE_ALLOCATED: encode_allocation(ALLOCATION)}

    with pytest.raises(SignatureError, match="pod uid-1: allocation is not signed"):
        verify_pod_annotations(KEYS, pod_uid="uid-1", node_name="n1", annotations=annotations)


@pytest.mark.parametrize(
    "signature",
    ["v2:" + "0" * 64, "v2:" + "0" * 16 + ":" + "A" * 85, "v2:" + "G" * 16 + ":" + "A" * 86,
     "v2:" + "0" * 16 + ":" + "A" * 85 + "=", "v3:" + "0" * 16 + ":" + "A" * 86, "0" * 64, "v2:", "ed25519"],
)
def test_a_signature_in_an_unknown_format_is_refused_as_such(signature: str) -> None:
    with pytest.raises(SignatureError, match="unknown format; expected v2:<16 hex digits of key id>:<86 base64url"):
        verify_allocation(KEYS, pod_uid="uid-1", node_name="n1", annotation="{}", signature=signature)


def test_an_allocation_marked_for_another_node_names_both_nodes() -> None:
    annotations = allocation_annotations(KEY, pod_uid="uid-1", node_name="n2", allocation=ALLOCATION)

    with pytest.raises(SignatureError, match=r"allocation is for node 'n2' .* not this node 'n1'"):
        verify_pod_annotations(KEYS, pod_uid="uid-1", node_name="n1", annotations=annotations)


def test_an_allocation_copied_to_another_pod_does_not_match_that_pod() -> None:
    annotations = allocation_annotations(KEY, pod_uid="uid-1", node_name="n1", allocation=ALLOCATION)

    with pytest.raises(SignatureError, match="does not match pod uid-2 on node n1"):
        verify_pod_annotations(KEYS, pod_uid="uid-2", node_name="n1", annotations=annotations)


def test_a_node_annotation_rewritten_to_this_node_still_fails_the_signature() -> None:
    annotations = allocation_annotations(KEY, pod_uid="uid-1", node_name="n2", allocation=ALLOCATION)
    annotations[names.ALLOCATION_NODE] = "n1"

    with pytest.raises(SignatureError, match="does not match pod uid-1 on node n1"):
        verify_pod_annotations(KEYS, pod_uid="uid-1", node_name="n1", annotations=annotations)


def test_a_correctly_signed_but_unreadable_allocation_is_an_allocation_error() -> None:
    annotation = '{"gpu":[{"minor":"zero"}]}'
    annotations = {
        names.DEVICE_ALLOCATED: annotation,
        names.ALLOCATION_SIGNATURE: sign_allocation(KEY, pod_uid="u", node_name="n", annotation=annotation),
    }

    with pytest.raises(AllocationError, match="minor='zero'"):
        verify_pod_annotations(KEYS, pod_uid="u", node_name="n", annotations=annotations)


def test_fields_are_length_prefixed_so_moving_a_boundary_changes_the_signature() -> None:
    a = sign_allocation(KEY, pod_uid="ab", node_name="c", annotation="d")
    b = sign_allocation(KEY, pod_uid="a", node_name="bc", annotation="d")
    c = sign_allocation(KEY, pod_uid="a", node_name="b", annotation="cd")

    assert len({a, b, c}) == 3


# --- several keys: rotation ---------------------------------------------------------


def test_signatures_of_every_key_in_the_set_verify() -> None:
    keys = verifying(KEY, OTHER)

    for key in (KEY, OTHER):
        annotations = allocation_annotations(key, pod_uid="u", node_name="n", allocation=ALLOCATION)
        assert verify_pod_annotations(keys, pod_uid="u", node_name="n", annotations=annotations) == ALLOCATION


def test_a_signature_by_a_key_not_in_the_set_is_refused_naming_the_key_id_and_the_fix() -> None:
    annotations = allocation_annotations(OTHER, pod_uid="u", node_name="n", allocation=ALLOCATION)

    with pytest.raises(SignatureError) as refused:
        verify_pod_annotations(KEYS, pod_uid="u", node_name="n", annotations=annotations)

    message = str(refused.value)
    assert f"signed with key {OTHER.key_id}, which is not one of the verifying keys here ({KEY.key_id})" in message
    assert "add its public key to every node's verifyingKeys (`fgpuctl keys public`" in message
    assert "delete the pod" in message


def test_a_node_with_no_public_key_says_it_has_none() -> None:
    signature = sign_allocation(KEY, pod_uid="u", node_name="n", annotation="{}")

    with pytest.raises(SignatureError, match=r"verifying keys here \(none\)"):
        verify_allocation(VerifyingKeys(), pod_uid="u", node_name="n", annotation="{}", signature=signature)


def test_a_tampered_v2_signature_is_refused() -> None:
    signature = sign_allocation(KEY, pod_uid="u", node_name="n", annotation="{}")
    last = signature[-2]
    tampered = signature[:-2] + ("B" if last != "B" else "C") + signature[-1]

    with pytest.raises(SignatureError, match=r"does not match pod u on node n: .* or the signature was changed"):
        verify_allocation(KEYS, pod_uid="u", node_name="n", annotation="{}", signature=tampered)


def test_a_signature_relabelled_with_another_known_key_id_is_refused() -> None:
    signature = sign_allocation(OTHER, pod_uid="u", node_name="n", annotation="{}")
    relabelled = signature.replace(OTHER.key_id, KEY.key_id)

    with pytest.raises(SignatureError, match="does not match pod u on node n"):
        verify_allocation(verifying(KEY, OTHER), pod_uid="u", node_name="n", annotation="{}", signature=relabelled)


def test_a_fixed_signing_key_signs_with_itself_and_verifies_its_own_signatures_only() -> None:
    assert KEY.signing_key() is KEY
    assert KEY.verifying_keys() == VerifyingKeys(keys=(KEY.public,))
    assert KEY.verifying_keys().legacy_key is None


def test_adding_keys_keeps_each_key_once_and_the_legacy_key() -> None:
    keys = verifying(KEY, legacy_key=b"old").with_keys(OTHER.public, KEY.public, OTHER.public)

    assert keys.key_ids == (KEY.key_id, OTHER.key_id)
    assert keys.legacy_key == b"old"


def test_the_key_id_of_a_signature_names_its_key_v1_or_nothing() -> None:
    assert signature_key_id(sign_allocation(KEY, pod_uid="u", node_name="n", annotation="{}")) == KEY.key_id
    assert signature_key_id(LEGACY_SIGNATURE) == "v1"
    assert signature_key_id("") == signature_key_id("forged") == ""


def test_a_seed_that_is_not_32_bytes_is_refused() -> None:
    with pytest.raises(SigningKeyError, match="an Ed25519 seed is 32 bytes, got 5"):
        SigningKey.from_seed(b"short")


def test_keys_print_their_id_and_never_their_secret() -> None:
    assert repr(KEY) == f"SigningKey(key_id='{KEY.key_id}')"
    assert "old" not in repr(verifying(KEY, legacy_key=b"old"))


# --- v1 (HMAC), the upgrade window ---------------------------------------------------


def _legacy_annotations() -> dict[str, str]:
    return {names.DEVICE_ALLOCATED: LEGACY_ANNOTATION, names.ALLOCATION_SIGNATURE: LEGACY_SIGNATURE}


def test_a_v1_signature_made_before_v2_verifies_while_the_legacy_key_is_given() -> None:
    keys = verifying(KEY, legacy_key=LEGACY_KEY)

    got = verify_pod_annotations(keys, pod_uid="uid-1", node_name="n1", annotations=_legacy_annotations())

    assert got == Allocation(gpus=())


def test_a_v1_signature_is_refused_without_a_legacy_key_saying_the_window_is_over_and_what_to_do() -> None:
    with pytest.raises(SignatureError) as refused:
        verify_pod_annotations(KEYS, pod_uid="uid-1", node_name="n1", annotations=_legacy_annotations())

    message = str(refused.value)
    assert "pod uid-1: allocation carries a v1 (HMAC) signature" in message
    assert "upgrade window is over (no legacySigningKey)" in message
    assert "delete the pod" in message


def test_a_v1_signature_checked_with_another_cluster_key_is_refused() -> None:
    keys = verifying(KEY, legacy_key=b"some-other-cluster-key")

    with pytest.raises(SignatureError, match="signed with another cluster key"):
        verify_pod_annotations(keys, pod_uid="uid-1", node_name="n1", annotations=_legacy_annotations())


def test_a_v1_signature_copied_to_another_pod_is_refused() -> None:
    keys = verifying(KEY, legacy_key=LEGACY_KEY)

    with pytest.raises(SignatureError, match="does not match pod uid-2 on node n1"):
        verify_pod_annotations(keys, pod_uid="uid-2", node_name="n1", annotations=_legacy_annotations())


@pytest.mark.parametrize("signature", ["v1:" + "0" * 63, "v1:" + "A" * 64, "v1:" + "g" * 64, "v1:"])
def test_a_malformed_v1_signature_is_refused_as_an_unknown_format(signature: str) -> None:
    keys = verifying(KEY, legacy_key=LEGACY_KEY)

    with pytest.raises(SignatureError, match="unknown format"):
        verify_allocation(keys, pod_uid="u", node_name="n", annotation="{}", signature=signature)


def test_the_legacy_key_verifies_no_v2_signature() -> None:
    signature = sign_allocation(KEY, pod_uid="u", node_name="n", annotation="{}")

    with pytest.raises(SignatureError, match=f"signed with key {KEY.key_id}"):
        verify_allocation(VerifyingKeys(legacy_key=LEGACY_KEY), pod_uid="u", node_name="n", annotation="{}", signature=signature)


def test_an_empty_legacy_key_is_refused_since_anyone_could_sign_with_it() -> None:
    with pytest.raises(SigningKeyError, match="legacy v1 signing key is empty"):
        VerifyingKeys(legacy_key=b"")


# --- properties -------------------------------------------------------------------


@given(seed=seeds, pod_uid=st.text(), node_name=st.text(), annotation=st.text())
def test_any_signature_verifies_for_what_it_was_made_for(seed: bytes, pod_uid: str, node_name: str, annotation: str) -> None:
    key = SigningKey.from_seed(seed)
    signature = sign_allocation(key, pod_uid=pod_uid, node_name=node_name, annotation=annotation)

    verify_allocation(key.verifying_keys(), pod_uid=pod_uid, node_name=node_name, annotation=annotation, signature=signature)


@given(seed=seeds, pod_uid=st.text(), node_name=st.text(min_size=1), allocation=allocations)
def test_any_signed_allocation_round_trips_through_pod_annotations(
    seed: bytes, pod_uid: str, node_name: str, allocation: Allocation
) -> None:
    key = SigningKey.from_seed(seed)
    annotations = allocation_annotations(key, pod_uid=pod_uid, node_name=node_name, allocation=allocation)

    got = verify_pod_annotations(key.verifying_keys(), pod_uid=pod_uid, node_name=node_name, annotations=annotations)

    assert got == allocation


FIELDS = ("pod_uid", "node_name", "annotation")


@given(
    original=st.fixed_dictionaries({f: st.text() for f in FIELDS}),
    changed_field=st.sampled_from(FIELDS),
    new_value=st.text(),
)
def test_any_change_to_uid_node_or_annotation_is_detected(
    original: dict[str, str], changed_field: str, new_value: str
) -> None:
    assume(new_value != original[changed_field])
    signature = sign_allocation(KEY, **original)
    tampered = {**original, changed_field: new_value}

    with pytest.raises(SignatureError, match="does not match pod"):
        verify_allocation(KEYS, signature=signature, **tampered)


@given(annotation=st.text(), forged=st.binary(min_size=64, max_size=64))
def test_any_other_well_formed_signature_is_detected(annotation: str, forged: bytes) -> None:
    signature = sign_allocation(KEY, pod_uid="u", node_name="n", annotation=annotation)
    candidate = f"v2:{KEY.key_id}:" + base64.urlsafe_b64encode(forged).rstrip(b"=").decode()
    assume(candidate != signature)

    with pytest.raises(SignatureError, match="does not match pod u on node n"):
        verify_allocation(KEYS, pod_uid="u", node_name="n", annotation=annotation, signature=candidate)


@given(seed=seeds, annotation=st.text())
def test_a_signature_made_with_a_key_outside_the_set_is_detected(seed: bytes, annotation: str) -> None:
    other = SigningKey.from_seed(seed)
    assume(other.key_id != KEY.key_id)
    signature = sign_allocation(other, pod_uid="u", node_name="n", annotation=annotation)

    with pytest.raises(SignatureError, match=f"signed with key {other.key_id}"):
        verify_allocation(KEYS, pod_uid="u", node_name="n", annotation=annotation, signature=signature)


@given(allocation=allocations, position=st.integers(min_value=0), replacement=st.characters())
def test_any_edit_to_a_signed_annotation_string_is_detected(
    allocation: Allocation, position: int, replacement: str
) -> None:
    annotations = allocation_annotations(KEY, pod_uid="u", node_name="n", allocation=allocation)
    text = annotations[names.DEVICE_ALLOCATED]
    i = position % len(text)
    assume(text[i] != replacement)
    annotations[names.DEVICE_ALLOCATED] = text[:i] + replacement + text[i + 1 :]

    with pytest.raises(SignatureError):
        verify_pod_annotations(KEYS, pod_uid="u", node_name="n", annotations=annotations)


@given(position=st.integers(min_value=0), replacement=st.sampled_from("ABCabc019-_"))
def test_any_edit_to_a_v2_signature_string_is_detected(position: int, replacement: str) -> None:
    signature = sign_allocation(KEY, pod_uid="u", node_name="n", annotation="{}")
    i = position % len(signature)
    assume(signature[i] != replacement)
    tampered = signature[:i] + replacement + signature[i + 1 :]

    with pytest.raises(SignatureError):
        verify_allocation(KEYS, pod_uid="u", node_name="n", annotation="{}", signature=tampered)


def test_the_tests_rebuild_v1_signatures_exactly_as_fgpu_made_them() -> None:
    made = legacy_v1_signature(LEGACY_KEY, pod_uid="uid-1", node_name="n1", annotation=LEGACY_ANNOTATION)

    assert made == LEGACY_SIGNATURE
