"""An agent that dies in the middle of a MIG create leaves nothing the next one takes for an operator's.

The create is announced in the record before NVML is asked. Each test kills the create at one
point (an exception no code path catches, raised from inside the fake NVML, as a SIGKILL would
stop the process there), then a fresh `MIGNode` over the same record file and the same GPU, a
restarted agent, settles what it finds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.fakenvml import FakeNVML
from agent.main import main as agent_main
from agent.mig_manager import Intent, Owned, Want
from agent.mig_nvml import MIGError, MIGNode, OwnedFile, Record, read_instances
from apis.devices import from_device_object
from tests.mig.test_mig_manager import GPU, node

WANT = Want("pod-a", GPU, "3g.40gb", 4)


class Killed(BaseException):
    """The agent process stops here (BaseException: no `except Exception` in the agent stops it)."""


def die_after(nvml: FakeNVML, monkeypatch: pytest.MonkeyPatch, call: str, *, before: bool = False) -> None:
    real = getattr(nvml, call)

    def dying(*args: Any) -> Any:
        if not before:
            real(*args)
        raise Killed(call)

    monkeypatch.setattr(nvml, call, dying)


def crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str, *, before: bool = False) -> tuple[FakeNVML, Path]:
    nvml = node()
    record = tmp_path / "mig.json"
    die_after(nvml, monkeypatch, call, before=before)
    with pytest.raises(Killed):
        MIGNode(nvml, OwnedFile(record)).prepare(WANT, live=[WANT])
    monkeypatch.undo()  # the restarted agent's NVML calls go through
    assert OwnedFile(record).load() == Record(intents=frozenset({Intent(GPU, "3g.40gb", 4)}))
    return nvml, record


def placed(nvml: FakeNVML) -> list[tuple[str, int, bool]]:
    return [(i.profile, i.placement_start, bool(i.uuid)) for i in read_instances(nvml, GPU)]


def test_a_crash_before_nvml_created_anything_drops_the_intent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nvml, record = crash(tmp_path, monkeypatch, "nvmlDeviceCreateGpuInstanceWithPlacement", before=True)

    assert MIGNode(nvml, OwnedFile(record)).reconcile([GPU], live=[]) == []

    assert placed(nvml) == []
    assert OwnedFile(record).load() == Record()


@pytest.mark.parametrize(
    ("call", "left"),
    [
        ("nvmlDeviceCreateGpuInstanceWithPlacement", [("3g.40gb", 4, False)]),  # a GPU instance, no compute instance
        ("nvmlGpuInstanceCreateComputeInstance", [("3g.40gb", 4, True)]),  # a whole MIG device, never recorded
    ],
    ids=["after the GPU instance", "after the compute instance"],
)
def test_an_instance_made_before_the_crash_is_fgpus_and_goes_when_no_pod_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str, left: list[tuple[str, int, bool]]
) -> None:
    nvml, record = crash(tmp_path, monkeypatch, call)
    assert placed(nvml) == left

    destroyed = MIGNode(nvml, OwnedFile(record)).reconcile([GPU], live=[])

    assert [(i.profile, i.placement_start) for i in destroyed] == [("3g.40gb", 4)]
    assert placed(nvml) == []
    assert OwnedFile(record).load() == Record()


def test_the_pod_that_was_being_admitted_gets_the_instance_made_for_it_on_kubelets_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml, record = crash(tmp_path, monkeypatch, "nvmlGpuInstanceCreateComputeInstance")
    (made,) = read_instances(nvml, GPU)

    # Without the intent this instance would be an operator's: refused to its own pod, never destroyed.
    again = MIGNode(nvml, OwnedFile(record)).prepare(WANT, live=[WANT])

    assert again == made.uuid
    assert OwnedFile(record).load() == Record(owned=frozenset({Owned(GPU, made.gi_id, "3g.40gb", 4, made.uuid)}))


def test_an_unsettled_intent_is_kept_on_gpus_not_looked_at_and_read_by_an_older_format_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml, record = crash(tmp_path, monkeypatch, "nvmlDeviceCreateGpuInstanceWithPlacement", before=True)

    assert MIGNode(nvml, OwnedFile(record)).reconcile([], live=[]) == []

    assert OwnedFile(record).load().intents == frozenset({Intent(GPU, "3g.40gb", 4)})
    rows = json.loads(record.read_text())
    assert rows == [{"intent": True, "gpu_uuid": GPU, "profile": "3g.40gb", "placement_start": 4}]
    assert "gi_id" not in rows[0]  # an agent before intents skips the row instead of owning GPU instance 0


def test_a_refused_create_drops_its_intent_and_claims_nothing_someone_else_put_there(tmp_path: Path) -> None:
    nvml = node()
    record = tmp_path / "mig.json"
    real = nvml.nvmlDeviceCreateGpuInstanceWithPlacement

    def operator_first(handle: Any, profile_id: int, placement: Any) -> Any:
        real(handle, profile_id, placement)  # an operator's nvidia-smi gets the placement first
        return real(handle, profile_id, placement)  # fgpu's own call: InsufficientResources

    nvml.nvmlDeviceCreateGpuInstanceWithPlacement = operator_first  # type: ignore[method-assign]
    with pytest.raises(MIGError, match="not free"):
        MIGNode(nvml, OwnedFile(record)).prepare(WANT, live=[WANT])

    assert OwnedFile(record).load() == Record()
    assert MIGNode(nvml, OwnedFile(record)).reconcile([GPU], live=[]) == []
    assert placed(nvml) == [("3g.40gb", 4, False)]  # the operator's GPU instance, untouched


@pytest.mark.parametrize("entry", ["owned", "intent"])
def test_a_one_shot_report_marks_fgpus_instances_as_the_daemon_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], entry: str
) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"gpus": [{
        "uuid": GPU, "name": "NVIDIA A100-SXM4-80GB", "memory": "80Gi", "busId": "00000000:07:00.0",
        "mig": {"mode": "enabled", "instances": [
            {"uuid": "MIG-fgpu", "profile": "3g.40gb", "gpuInstanceId": 2},  # laid out at memory slice 0
            {"uuid": "MIG-op", "profile": "1g.10gb", "gpuInstanceId": 9},
        ]},
    }]}))
    # The record of the node's agent (its state directory: the hook socket's), as the daemon left it.
    OwnedFile(tmp_path / "mig-instances.json").save(
        Record(owned=frozenset({Owned(GPU, 2, "3g.40gb", 0, "MIG-fgpu")})) if entry == "owned"
        else Record(intents=frozenset({Intent(GPU, "3g.40gb", 0)}))
    )

    code = agent_main([
        "--once", "--print", "device", "--node-name", "n1", "--fake-nvml", str(inventory),
        "--hook-listen", f"unix://{tmp_path}/hooks.sock",
    ])

    assert code == 0
    (gpu,) = from_device_object(json.loads(capsys.readouterr().out)).gpus
    assert {m.uuid: m.fgpu_created for m in gpu.mig_instances} == {"MIG-fgpu": True, "MIG-op": False}
