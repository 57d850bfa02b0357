"""The allocation signature: a node accepts only what the cluster key signed, for this pod and node."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from apis import names
from apis.allocation import Allocation, AllocationError, GPUShare, encode_allocation
from apis.signing import (
    SignatureError,
    SigningKeyError,
    allocation_annotations,
    load_key,
    sign_allocation,
    verify_allocation,
    verify_pod_annotations,
)
from tests.apis_codec.strategies import allocations

KEY = b"cluster-key-for-tests"
ALLOCATION = Allocation(
    gpus=(GPUShare(minor=0, uuid="GPU-0", core_percent=50, memory_bytes=20 * 2**30, memory_ratio_percent=50),)
)
keys = st.binary(min_size=1, max_size=64)


def test_signature_is_version_one_hmac_sha256_in_hex() -> None:
    signature = sign_allocation(KEY, pod_uid="uid-1", node_name="n1", annotation="{}")

    version, _, digest = signature.partition(":")
    assert version == "v1"
    assert len(digest) == 64
    assert int(digest, 16) >= 0


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

    got = verify_pod_annotations(KEY, pod_uid="uid-1", node_name="n1", annotations={**annotations, "other": "x"})

    assert got == ALLOCATION


def test_a_pod_without_an_allocation_has_nothing_to_verify() -> None:
    assert verify_pod_annotations(KEY, pod_uid="uid-1", node_name="n1", annotations={"a": "b"}) is None


def test_an_unsigned_allocation_is_refused_as_not_signed() -> None:
    annotations = {names.DEVICE_ALLOCATED: encode_allocation(ALLOCATION)}

    with pytest.raises(SignatureError, match="pod uid-1: allocation is not signed"):
        verify_pod_annotations(KEY, pod_uid="uid-1", node_name="n1", annotations=annotations)


@pytest.mark.parametrize(
    "signature", ["v2:" + "0" * 64, "v1:" + "0" * 63, "v1:" + "A" * 64, "v1:" + "g" * 64, "0" * 64, "v1:", "hmac"]
)
def test_a_signature_in_an_unknown_format_is_refused_as_such(signature: str) -> None:
    with pytest.raises(SignatureError, match="unknown format; expected v1:<64 lowercase hex digits>"):
        verify_allocation(KEY, pod_uid="uid-1", node_name="n1", annotation="{}", signature=signature)


def test_an_allocation_marked_for_another_node_names_both_nodes() -> None:
    annotations = allocation_annotations(KEY, pod_uid="uid-1", node_name="n2", allocation=ALLOCATION)

    with pytest.raises(SignatureError, match=r"allocation is for node 'n2' .* not this node 'n1'"):
        verify_pod_annotations(KEY, pod_uid="uid-1", node_name="n1", annotations=annotations)


def test_an_allocation_copied_to_another_pod_does_not_match_that_pod() -> None:
    annotations = allocation_annotations(KEY, pod_uid="uid-1", node_name="n1", allocation=ALLOCATION)

    with pytest.raises(SignatureError, match="does not match pod uid-2 on node n1"):
        verify_pod_annotations(KEY, pod_uid="uid-2", node_name="n1", annotations=annotations)


def test_a_node_annotation_rewritten_to_this_node_still_fails_the_signature() -> None:
    annotations = allocation_annotations(KEY, pod_uid="uid-1", node_name="n2", allocation=ALLOCATION)
    annotations[names.ALLOCATION_NODE] = "n1"

    with pytest.raises(SignatureError, match="does not match pod uid-1 on node n1"):
        verify_pod_annotations(KEY, pod_uid="uid-1", node_name="n1", annotations=annotations)


def test_a_correctly_signed_but_unreadable_allocation_is_an_allocation_error() -> None:
    annotation = '{"gpu":[{"minor":"zero"}]}'
    annotations = {
        names.DEVICE_ALLOCATED: annotation,
        names.ALLOCATION_SIGNATURE: sign_allocation(KEY, pod_uid="u", node_name="n", annotation=annotation),
    }

    with pytest.raises(AllocationError, match="minor='zero'"):
        verify_pod_annotations(KEY, pod_uid="u", node_name="n", annotations=annotations)


def test_fields_are_length_prefixed_so_moving_a_boundary_changes_the_signature() -> None:
    a = sign_allocation(KEY, pod_uid="ab", node_name="c", annotation="d")
    b = sign_allocation(KEY, pod_uid="a", node_name="bc", annotation="d")
    c = sign_allocation(KEY, pod_uid="a", node_name="b", annotation="cd")

    assert len({a, b, c}) == 3


def test_signing_with_an_empty_key_is_refused() -> None:
    with pytest.raises(SigningKeyError, match="key is empty"):
        sign_allocation(b"", pod_uid="u", node_name="n", annotation="{}")


def test_loads_a_key_without_its_trailing_newline(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_bytes(b"s3cret\r\n")

    assert load_key(str(path)) == b"s3cret"


def test_a_key_with_and_without_a_trailing_newline_signs_alike(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"s3cret\n")
    (tmp_path / "b").write_bytes(b"s3cret")

    sig_a = sign_allocation(load_key(str(tmp_path / "a")), pod_uid="u", node_name="n", annotation="{}")
    sig_b = sign_allocation(load_key(str(tmp_path / "b")), pod_uid="u", node_name="n", annotation="{}")

    assert sig_a == sig_b


@pytest.mark.parametrize("content", [b"", b"\n", b"\r\n\n"])
def test_an_empty_key_file_is_refused_with_how_to_make_one(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "key"
    path.write_bytes(content)

    with pytest.raises(SigningKeyError, match=f"{path} is empty; write a random key"):
        load_key(str(path))


def test_a_missing_key_file_is_refused_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nope"

    with pytest.raises(SigningKeyError, match=f"{path} does not exist"):
        load_key(str(path))


def test_a_key_path_that_is_not_a_readable_file_is_refused_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(SigningKeyError, match=f"{tmp_path} cannot be read: Is a directory"):
        load_key(str(tmp_path))


# --- properties -------------------------------------------------------------------


@given(key=keys, pod_uid=st.text(), node_name=st.text(), annotation=st.text())
def test_any_signature_verifies_for_what_it_was_made_for(
    key: bytes, pod_uid: str, node_name: str, annotation: str
) -> None:
    signature = sign_allocation(key, pod_uid=pod_uid, node_name=node_name, annotation=annotation)

    verify_allocation(key, pod_uid=pod_uid, node_name=node_name, annotation=annotation, signature=signature)


@given(key=keys, pod_uid=st.text(), node_name=st.text(min_size=1), allocation=allocations)
def test_any_signed_allocation_round_trips_through_pod_annotations(
    key: bytes, pod_uid: str, node_name: str, allocation: Allocation
) -> None:
    annotations = allocation_annotations(key, pod_uid=pod_uid, node_name=node_name, allocation=allocation)

    assert verify_pod_annotations(key, pod_uid=pod_uid, node_name=node_name, annotations=annotations) == allocation


FIELDS = ("pod_uid", "node_name", "annotation")


@given(
    key=keys,
    original=st.fixed_dictionaries({f: st.text() for f in FIELDS}),
    changed_field=st.sampled_from(FIELDS),
    new_value=st.text(),
)
def test_any_change_to_uid_node_or_annotation_is_detected(
    key: bytes, original: dict[str, str], changed_field: str, new_value: str
) -> None:
    assume(new_value != original[changed_field])
    signature = sign_allocation(key, **original)
    tampered = {**original, changed_field: new_value}

    with pytest.raises(SignatureError, match="does not match pod"):
        verify_allocation(key, signature=signature, **tampered)


@given(key=keys, annotation=st.text(), digest=st.binary(min_size=32, max_size=32))
def test_any_other_well_formed_signature_is_detected(key: bytes, annotation: str, digest: bytes) -> None:
    signature = sign_allocation(key, pod_uid="u", node_name="n", annotation=annotation)
    forged = "v1:" + digest.hex()
    assume(forged != signature)

    with pytest.raises(SignatureError, match="does not match pod u on node n"):
        verify_allocation(key, pod_uid="u", node_name="n", annotation=annotation, signature=forged)


@given(key=keys, other_key=keys, annotation=st.text())
def test_a_signature_made_with_another_key_is_detected(key: bytes, other_key: bytes, annotation: str) -> None:
    assume(key != other_key)
    signature = sign_allocation(other_key, pod_uid="u", node_name="n", annotation=annotation)

    with pytest.raises(SignatureError, match="signed with another cluster key"):
        verify_allocation(key, pod_uid="u", node_name="n", annotation=annotation, signature=signature)


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
        verify_pod_annotations(KEY, pod_uid="u", node_name="n", annotations=annotations)
