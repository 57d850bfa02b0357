"""Key files: the scheduler's private key, the nodes' public keys, the legacy v1 key, and re-reading them on change."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from apis import names
from apis.allocation import Allocation, GPUShare
from apis.keyfiles import (
    SchedulerKeyFiles,
    VerifyingKeyFiles,
    load_key,
    load_legacy_key,
    load_verifying_keys,
    private_pem,
    public_pem,
    write_key_pair,
)
from apis.signing import (
    SignatureError,
    SigningKey,
    SigningKeyError,
    VerifyingKeys,
    allocation_annotations,
    verify_pod_annotations,
)
from tests.signing_keys import signing_key, write_signing_key, write_verifying_keys

OLD = signing_key("rotation-old")
NEW = signing_key("rotation-new")
ALLOCATION = Allocation(gpus=(GPUShare(minor=0, uuid="GPU-0", core_percent=50, memory_bytes=2**30, memory_ratio_percent=50),))
#: Made by fgpu before v2 (apis/signing.py at 4d18507) with the HMAC key b"cluster-key-for-tests".
LEGACY_POD = {
    names.DEVICE_ALLOCATED: '{"gpu":[]}',
    names.ALLOCATION_SIGNATURE: "v1:fa90df634242679f4556c1c47cc4fd29e1f79d159825fb2d91b35bef41f0dca2",
}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _signed(key: SigningKey, uid: str) -> dict[str, str]:
    return allocation_annotations(key, pod_uid=uid, node_name="n1", allocation=ALLOCATION)


def _verifies(keys: VerifyingKeys, annotations: dict[str, str], uid: str) -> bool:
    try:
        verify_pod_annotations(keys, pod_uid=uid, node_name="n1", annotations=annotations)
    except SignatureError:
        return False
    return True


# --- formats ----------------------------------------------------------------------------


def test_a_generated_key_pair_round_trips_through_its_files(tmp_path: Path) -> None:
    private, public = write_key_pair(str(tmp_path / "keys"), NEW)

    assert os.path.basename(private) == f"{NEW.key_id}.key" and os.path.basename(public) == f"{NEW.key_id}.pub"
    assert load_key(private) == NEW
    assert load_verifying_keys(public).key_ids == (NEW.key_id,)
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600


def test_writing_a_key_pair_never_overwrites_a_key(tmp_path: Path) -> None:
    write_key_pair(str(tmp_path), NEW)

    with pytest.raises(FileExistsError):
        write_key_pair(str(tmp_path), NEW)


def test_a_missing_signing_key_file_is_refused_naming_the_path_and_how_to_make_one(tmp_path: Path) -> None:
    path = tmp_path / "nope"

    with pytest.raises(SigningKeyError, match=f"signing key file {path} does not exist; make a key pair with `fgpuctl keys generate"):
        load_key(str(path))


@pytest.mark.parametrize("content", [b"", b"\n", b"\r\n\n"])
def test_an_empty_signing_key_file_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "key"
    path.write_bytes(content)

    with pytest.raises(SigningKeyError, match=f"{path} is empty; make a key pair with"):
        load_key(str(path))


def test_a_signing_key_path_that_is_a_directory_is_refused_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(SigningKeyError, match=f"{tmp_path} cannot be read: Is a directory"):
        load_key(str(tmp_path))


def test_an_old_hmac_key_given_as_the_signing_key_is_refused_with_the_upgrade_hint(tmp_path: Path) -> None:
    path = tmp_path / "signing-key"
    path.write_bytes(b"c2VjcmV0LWhtYWMta2V5\n")

    with pytest.raises(SigningKeyError, match="looks like a v1 HMAC key from before: give that to the agents as legacySigningKey"):
        load_key(str(path))


def test_a_public_key_given_as_the_signing_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "signing-key"
    path.write_bytes(public_pem(NEW.public))

    with pytest.raises(SigningKeyError, match=r"is not an Ed25519 private key .* holds no PEM private key"):
        load_key(str(path))


def test_a_verifying_keys_file_may_hold_several_keys_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "keys.pem"
    path.write_bytes(b"# old, retiring\n" + public_pem(OLD.public) + b"\n# new\n" + public_pem(NEW.public))

    assert load_verifying_keys(str(path)).key_ids == (OLD.key_id, NEW.key_id)


def test_a_verifying_keys_directory_as_a_configmap_volume_holds_it_reads_each_key_once(tmp_path: Path) -> None:
    # kubelet's layout: a timestamped directory, "..data" linking to it, one link per data key.
    data = tmp_path / "..2025_01_01_00_00_00.000000001"
    write_verifying_keys(str(data), OLD, NEW)
    (tmp_path / "..data").symlink_to(data.name)
    for name in os.listdir(data):
        (tmp_path / name).symlink_to(f"..data/{name}")

    assert sorted(load_verifying_keys(str(tmp_path)).key_ids) == sorted([OLD.key_id, NEW.key_id])


def test_a_private_key_among_the_verifying_keys_is_refused_outright(tmp_path: Path) -> None:
    write_verifying_keys(str(tmp_path), OLD)
    write_signing_key(str(tmp_path / "oops.key"), NEW)

    with pytest.raises(SigningKeyError, match="holds a private key; nodes get public keys only"):
        load_verifying_keys(str(tmp_path))


def test_a_file_without_a_public_key_among_the_verifying_keys_is_refused_naming_it(tmp_path: Path) -> None:
    write_verifying_keys(str(tmp_path), OLD)
    (tmp_path / "README").write_text("keys go here\n")

    with pytest.raises(SigningKeyError, match=f"{tmp_path / 'README'} holds no public key"):
        load_verifying_keys(str(tmp_path))


def test_an_empty_verifying_keys_directory_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(SigningKeyError, match="no public key file in the directory; add the scheduler's public key"):
        load_verifying_keys(str(tmp_path))


def test_the_legacy_key_loses_its_trailing_newline_and_signs_as_before(tmp_path: Path) -> None:
    write_verifying_keys(str(tmp_path / "pub"), NEW)
    (tmp_path / "legacy").write_bytes(b"cluster-key-for-tests\r\n")

    keys = load_verifying_keys(str(tmp_path / "pub"), legacy_key=str(tmp_path / "legacy"))

    assert keys.legacy_key == b"cluster-key-for-tests"
    assert _verifies(keys, LEGACY_POD, "uid-1")


@pytest.mark.parametrize("content", [None, b"", b"\n"])
def test_no_empty_or_missing_legacy_key_file_means_v1_is_refused(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "legacy"
    if content is not None:
        path.write_bytes(content)

    assert load_legacy_key(str(path)) is None
    assert load_legacy_key("") is None


# --- re-reading: rotation restarts nothing ----------------------------------------------


def test_a_public_key_added_to_the_set_is_accepted_without_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    keys = VerifyingKeyFiles(write_verifying_keys(str(tmp_path), OLD), clock=clock)
    assert not _verifies(keys.verifying_keys(), _signed(NEW, "b"), "b")

    write_verifying_keys(str(tmp_path), NEW)
    clock.now += 1.0

    assert _verifies(keys.verifying_keys(), _signed(NEW, "b"), "b")
    assert _verifies(keys.verifying_keys(), _signed(OLD, "a"), "a")


def test_the_files_are_read_again_at_most_once_per_interval(tmp_path: Path) -> None:
    clock = Clock()
    keys = VerifyingKeyFiles(write_verifying_keys(str(tmp_path), OLD), clock=clock, min_interval_s=5.0)
    assert keys.verifying_keys().key_ids == (OLD.key_id,)

    write_verifying_keys(str(tmp_path), NEW)
    clock.now += 4.9
    assert keys.verifying_keys().key_ids == (OLD.key_id,)
    clock.now += 0.1
    assert sorted(keys.verifying_keys().key_ids) == sorted([OLD.key_id, NEW.key_id])


def test_a_public_key_dropped_from_the_set_is_refused_after_the_next_read(tmp_path: Path) -> None:
    clock = Clock()
    keys = VerifyingKeyFiles(write_verifying_keys(str(tmp_path), OLD, NEW), clock=clock)
    assert _verifies(keys.verifying_keys(), _signed(OLD, "a"), "a")

    (tmp_path / f"{OLD.key_id}.pub").unlink()
    clock.now += 1.0

    assert not _verifies(keys.verifying_keys(), _signed(OLD, "a"), "a")
    assert _verifies(keys.verifying_keys(), _signed(NEW, "b"), "b")


def test_a_bad_edit_keeps_the_last_good_keys_and_says_why(tmp_path: Path) -> None:
    clock = Clock()
    keys = VerifyingKeyFiles(write_verifying_keys(str(tmp_path), OLD), clock=clock)
    keys.verifying_keys()

    (tmp_path / f"{OLD.key_id}.pub").write_bytes(b"-----BEGIN PUBLIC KEY-----\ngarbage\n-----END PUBLIC KEY-----\n")
    clock.now += 1.0

    assert keys.verifying_keys().key_ids == (OLD.key_id,)
    assert keys.last_error is not None and "cannot read a public key" in keys.last_error


def test_without_a_first_good_read_every_call_raises_and_the_next_one_tries_again(tmp_path: Path) -> None:
    keys = VerifyingKeyFiles(str(tmp_path / "keys"), clock=Clock())
    with pytest.raises(SigningKeyError, match="does not exist"):
        keys.verifying_keys()

    write_verifying_keys(str(tmp_path / "keys"), OLD)

    assert keys.verifying_keys().key_ids == (OLD.key_id,)


def test_deleting_the_legacy_key_ends_the_upgrade_window_without_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    legacy = tmp_path / "legacy"
    legacy.write_bytes(b"cluster-key-for-tests\n")
    keys = VerifyingKeyFiles(write_verifying_keys(str(tmp_path / "pub"), NEW), legacy_path=str(legacy), clock=clock)
    assert _verifies(keys.verifying_keys(), LEGACY_POD, "uid-1")

    legacy.unlink()
    clock.now += 1.0

    assert not _verifies(keys.verifying_keys(), LEGACY_POD, "uid-1")
    assert _verifies(keys.verifying_keys(), _signed(NEW, "b"), "b")


def test_the_scheduler_switches_to_a_new_private_key_without_a_restart_and_still_verifies_the_old_ones(
    tmp_path: Path,
) -> None:
    clock = Clock()
    private = write_signing_key(str(tmp_path / "signing-key.pem"), OLD)
    public = write_verifying_keys(str(tmp_path / "pub"), OLD, NEW)
    scheduler = SchedulerKeyFiles(private, verifying_path=public, clock=clock)
    assert scheduler.signing_key() == OLD

    write_signing_key(private, NEW)
    clock.now += 1.0

    assert scheduler.signing_key() == NEW
    assert sorted(scheduler.verifying_keys().key_ids) == sorted([OLD.key_id, NEW.key_id])


def test_the_scheduler_always_verifies_its_own_signatures_even_without_a_public_key_set(tmp_path: Path) -> None:
    scheduler = SchedulerKeyFiles(write_signing_key(str(tmp_path / "k"), NEW), clock=Clock())

    assert scheduler.verifying_keys().key_ids == (NEW.key_id,)


def test_the_scheduler_keeps_signing_with_its_last_good_key_when_the_file_turns_bad(tmp_path: Path) -> None:
    clock = Clock()
    private = write_signing_key(str(tmp_path / "k"), OLD)
    scheduler = SchedulerKeyFiles(private, clock=clock)

    Path(private).write_bytes(b"")
    clock.now += 1.0

    assert scheduler.signing_key() == OLD


@pytest.mark.parametrize("which", ["signing", "verifying"])
def test_a_scheduler_key_file_that_is_bad_at_start_stops_the_start(tmp_path: Path, which: str) -> None:
    private = str(tmp_path / "k") if which == "signing" else write_signing_key(str(tmp_path / "k"), OLD)
    public = str(tmp_path / "missing")

    with pytest.raises(SigningKeyError, match="does not exist"):
        SchedulerKeyFiles(private, verifying_path=public)


def test_a_rotation_restarts_nothing_and_old_pods_verify_until_their_key_is_dropped(tmp_path: Path) -> None:
    """docs/deploy.md "Rotating the signing key", step by step, with one scheduler and one node."""
    clock = Clock()
    private = write_signing_key(str(tmp_path / "signing-key.pem"), OLD)
    public_dir = write_verifying_keys(str(tmp_path / "verifying-keys"), OLD)
    scheduler = SchedulerKeyFiles(private, verifying_path=public_dir, clock=clock)
    node = VerifyingKeyFiles(public_dir, clock=clock)
    pod_a = allocation_annotations(scheduler.signing_key(), pod_uid="a", node_name="n1", allocation=ALLOCATION)
    assert _verifies(node.verifying_keys(), pod_a, "a")

    # 1. The new public key goes to every node.
    write_verifying_keys(public_dir, NEW)
    clock.now += 1.0
    # 2. The scheduler switches its private key.
    Path(private).write_bytes(private_pem(NEW))
    clock.now += 1.0
    pod_b = allocation_annotations(scheduler.signing_key(), pod_uid="b", node_name="n1", allocation=ALLOCATION)
    assert pod_b[names.ALLOCATION_SIGNATURE].startswith(f"v2:{NEW.key_id}:")
    # A container of pod a restarts: kubelet sends its old annotations again.
    assert _verifies(node.verifying_keys(), pod_a, "a") and _verifies(node.verifying_keys(), pod_b, "b")
    assert _verifies(scheduler.verifying_keys(), pod_a, "a")

    # 3. Pod a is gone; the old public key is dropped.
    (Path(public_dir) / f"{OLD.key_id}.pub").unlink()
    clock.now += 1.0
    assert _verifies(node.verifying_keys(), pod_b, "b")
    assert not _verifies(node.verifying_keys(), pod_a, "a")
