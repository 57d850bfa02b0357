"""`fgpuctl keys`: generate a key pair, derive the public key, list key ids, and find the keys pods still need."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from apis import names
from apis.allocation import Allocation, GPUShare
from apis.keyfiles import load_key, load_verifying_keys, parse_public_keys, public_pem
from apis.signing import allocation_annotations, verify_pod_annotations
from fgpuctl.keys import keys_in_use
from fgpuctl.main import main
from tests.signing_keys import signing_key, write_signing_key, write_verifying_keys

KEY = signing_key("fgpuctl-keys")
OLD = signing_key("fgpuctl-keys-old")
SHARE = GPUShare(minor=0, uuid="GPU-0", core_percent=50, memory_bytes=2**30, memory_ratio_percent=50)
LEGACY_SIGNATURE = "v1:fa90df634242679f4556c1c47cc4fd29e1f79d159825fb2d91b35bef41f0dca2"


def _pod(name: str, annotations: dict[str, str], phase: str = "Running") -> dict[str, object]:
    return {"metadata": {"namespace": "ml", "name": name, "annotations": annotations}, "status": {"phase": phase}}


def _signed(key_name: str, uid: str) -> dict[str, str]:
    key = KEY if key_name == "new" else OLD
    return allocation_annotations(key, pod_uid=uid, node_name="n1", allocation=Allocation(gpus=(SHARE,)))


def test_generate_writes_a_key_pair_that_signs_and_verifies_and_says_how_to_install_and_rotate_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "generate", "--out", str(tmp_path / "keys")]) == 0

    (private,) = (tmp_path / "keys").glob("*.key")
    key = load_key(str(private))
    keys = load_verifying_keys(str(tmp_path / "keys" / f"{key.key_id}.pub"))
    annotations = allocation_annotations(key, pod_uid="u", node_name="n", allocation=Allocation(gpus=(SHARE,)))
    assert verify_pod_annotations(keys, pod_uid="u", node_name="n", annotations=annotations) is not None
    out = capsys.readouterr().out
    assert out.startswith(f"key id {key.key_id}\n")
    assert f"create configmap {names.VERIFYING_KEYS_CONFIGMAP} --from-file=" in out
    assert f"create secret generic {names.SIGNING_KEY_SECRET} --from-file={names.SIGNING_KEY_FILE}={private}" in out
    assert "fgpuctl keys in-use --key OLD-ID" in out


def test_generate_twice_into_one_directory_makes_two_keys(tmp_path: Path) -> None:
    assert main(["keys", "generate", "--out", str(tmp_path)]) == 0
    assert main(["keys", "generate", "--out", str(tmp_path)]) == 0

    assert len(list(tmp_path.glob("*.key"))) == len(list(tmp_path.glob("*.pub"))) == 2


def test_public_prints_the_public_key_of_a_private_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    private = write_signing_key(str(tmp_path / "k.pem"), KEY)

    assert main(["keys", "public", "--in", private]) == 0

    assert capsys.readouterr().out.encode() == public_pem(KEY.public)


def test_public_as_a_patch_adds_the_key_to_the_verifying_keys_configmap_by_its_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    private = write_signing_key(str(tmp_path / "k.pem"), KEY)

    assert main(["keys", "public", "--in", private, "-o", "patch"]) == 0

    patch = json.loads(capsys.readouterr().out)
    ((name, pem),) = patch["data"].items()
    assert name == f"{KEY.key_id}.pub"
    assert parse_public_keys(pem.encode(), where="patch")[0].key_id == KEY.key_id


def test_public_reads_the_private_key_from_stdin(tmp_path: Path) -> None:
    private = Path(write_signing_key(str(tmp_path / "k.pem"), KEY)).read_bytes()

    done = subprocess.run(
        [sys.executable, "-m", "fgpuctl.main", "keys", "public", "--in", "-"], input=private, capture_output=True, check=True
    )

    assert done.stdout == public_pem(KEY.public)


def test_public_of_a_missing_file_fails_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "public", "--in", str(tmp_path / "nope")]) == 1

    assert f"signing key file {tmp_path / 'nope'} does not exist" in capsys.readouterr().err


def test_list_names_the_key_id_and_kind_of_every_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_verifying_keys(str(tmp_path / "pub"), KEY, OLD)
    private = write_signing_key(str(tmp_path / "k.pem"), KEY)

    assert main(["keys", "list", str(tmp_path / "pub"), private]) == 0

    lines = sorted(capsys.readouterr().out.splitlines())
    assert lines == sorted([
        f"{KEY.key_id}  public   {tmp_path / 'pub' / (KEY.key_id + '.pub')}",
        f"{OLD.key_id}  public   {tmp_path / 'pub' / (OLD.key_id + '.pub')}",
        f"{KEY.key_id}  private  {private}",
    ])


def test_keys_in_use_counts_unfinished_pods_with_gpus_by_the_key_that_signed_them() -> None:
    pods = [
        _pod("a", _signed("new", "a")),
        _pod("b", _signed("old", "b")),
        _pod("c", _signed("old", "c"), phase="Succeeded"),  # finished: never restarted, needs no key
        _pod("d", {names.DEVICE_ALLOCATED: '{"gpu":[]}', names.ALLOCATION_SIGNATURE: LEGACY_SIGNATURE}),  # no GPU
        _pod("e", {**_signed("old", "e"), names.ALLOCATION_SIGNATURE: LEGACY_SIGNATURE}),
        _pod("f", {names.DEVICE_ALLOCATED: _signed("new", "f")[names.DEVICE_ALLOCATED]}),
        _pod("g", {}),
    ]

    assert keys_in_use(pods) == {KEY.key_id: ["ml/a"], OLD.key_id: ["ml/b"], "v1": ["ml/e"], "unsigned": ["ml/f"]}


def test_in_use_reads_kubectl_json_and_lists_the_pods_of_one_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    listing = tmp_path / "pods.json"
    listing.write_text(json.dumps({"kind": "List", "items": [_pod("a", _signed("new", "a")), _pod("b", _signed("old", "b"))]}))

    assert main(["keys", "in-use", "-f", str(listing)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["KEY", "PODS"]
    assert sorted(line.split() for line in table[1:]) == sorted([[KEY.key_id, "1"], [OLD.key_id, "1"]])

    assert main(["keys", "in-use", "-f", str(listing), "--key", OLD.key_id]) == 0
    assert capsys.readouterr().out == "ml/b\n"


def test_in_use_refuses_input_that_is_not_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    listing = tmp_path / "pods.yaml"
    listing.write_text("items: []\n")

    assert main(["keys", "in-use", "-f", str(listing)]) == 1
    assert "not JSON" in capsys.readouterr().err


def test_keys_without_an_action_prints_its_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys"]) == 2
    assert "generate" in capsys.readouterr().err
