"""fgpu's record of the MIG instances it made: never written through a link or into a directory others may
write, and an entry from before the record carried MIG UUIDs proves nothing (leaked, never destroyed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.mig_manager import Owned, Want
from agent.mig_nvml import MIGError, MIGNode, OwnedFile, Record, RecordError, read_instances
from tests.mig.test_mig_manager import GPU, node

ENTRY = Owned(GPU, 2, "3g.40gb", 4, "MIG-made")


def state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir(mode=0o755)
    return path


def test_a_symlink_at_the_record_path_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    record = state_dir(tmp_path) / "mig-instances.json"
    record.symlink_to(victim)

    assert OwnedFile(record).load() == Record()  # a link is not read either
    OwnedFile(record).save(Record(owned=frozenset({ENTRY})))

    assert victim.read_text() == "keep me"
    assert not record.is_symlink()
    assert OwnedFile(record).load() == Record(owned=frozenset({ENTRY}))
    assert sorted(p.name for p in record.parent.iterdir()) == ["mig-instances.json"]  # no temporary file left


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777])
def test_a_state_dir_others_may_write_is_refused_with_the_fix(tmp_path: Path, mode: int) -> None:
    directory = state_dir(tmp_path)
    good = OwnedFile(directory / "mig-instances.json")
    good.save(Record(owned=frozenset({ENTRY})))
    os.chmod(directory, mode)

    with pytest.raises(RecordError, match=rf"{directory} is writable by group or others \(mode {mode:o}\).*chmod go-w"):
        good.save(Record())
    # A record anyone could have forged makes nothing fgpu's.
    assert good.load() == Record()


def test_nothing_is_created_when_the_record_cannot_be_written_safely(tmp_path: Path) -> None:
    nvml = node()
    directory = state_dir(tmp_path)
    os.chmod(directory, 0o777)
    want = Want("pod-a", GPU, "3g.40gb", 4)

    with pytest.raises(MIGError, match="writable by group or others"):
        MIGNode(nvml, OwnedFile(directory / "mig-instances.json")).prepare(want, live=[want])

    assert read_instances(nvml, GPU) == []


def test_an_entry_without_a_mig_uuid_from_an_older_agent_is_leaked_never_destroyed(tmp_path: Path) -> None:
    nvml = node()
    record = state_dir(tmp_path) / "mig-instances.json"
    want = Want("gone", GPU, "3g.40gb", 4)
    made = MIGNode(nvml, OwnedFile(record)).prepare(want, live=[want])
    # The record as an agent before this change wrote it: the same entry without "uuid".
    rows = json.loads(record.read_text())
    record.write_text(json.dumps([{k: v for k, v in row.items() if k != "uuid"} for row in rows]))

    restarted = MIGNode(nvml, OwnedFile(record))

    assert OwnedFile(record).load() == Record()
    assert restarted.reconcile([GPU], live=[]) == []
    assert [i.uuid for i in read_instances(nvml, GPU)] == [made]
    assert restarted.owned([GPU]) == [(read_instances(nvml, GPU)[0], False)]
