"""When the agent may switch a GPU's MIG mode, and what NVML's answer means: the pure core, table-driven."""

from __future__ import annotations

import pynvml
import pytest

from agent import mig_mode
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import parse_inventory
from agent.mig_manager import Instance
from agent.mig_mode import Answer, GPUFacts, SetError, Switch, after_set, decide, set_failed
from apis.mig_mode import ModeState, ModeStatus, decode_status, encode_status

U = "GPU-0"
IDLE_OFF = GPUFacts(uuid=U, index=0, supported=True, current=False, pending=False)
IDLE_ON = GPUFacts(uuid=U, index=0, supported=True, current=True, pending=True)
MINE = Instance(U, 1, "3g.40gb", 4, uuid="MIG-mine")
THEIRS = Instance(U, 2, "1g.10gb", 0, uuid="MIG-op")


def _with(facts: GPUFacts, **changes: object) -> GPUFacts:
    return GPUFacts(**{**facts.__dict__, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("enable", "gpu", "cordoned", "complete", "state", "finished", "fragment"),
    [
        (True, None, True, True, ModeState.FAILED, True, "this node has no GPU GPU-0"),
        (True, _with(IDLE_OFF, supported=False), True, True, ModeState.FAILED, True, "does not support MIG"),
        (True, IDLE_ON, True, True, ModeState.DONE, True, "is in MIG mode"),
        (False, IDLE_OFF, False, False, ModeState.DONE, True, "is out of MIG mode"),  # done needs no drain
        (True, IDLE_OFF, True, False, ModeState.WAITING, False, "has not yet counted the pods"),
        (True, IDLE_OFF, False, True, ModeState.WAITING, False, "the node is not cordoned"),
        (True, _with(IDLE_OFF, holders=("uid-b", "uid-a")), True, True, ModeState.WAITING, False, "pods hold it (uid-a, uid-b)"),
        (True, _with(IDLE_OFF, processes=2), True, True, ModeState.WAITING, False, "2 process(es) run on it"),
        (False, _with(IDLE_ON, instances=((MINE, True), (THEIRS, False))), True, True, ModeState.WAITING, False,
         "MIG instances fgpu did not create (1g.10gb at 0 (GPU instance 2))"),
    ],
    ids=["no such GPU", "no MIG", "already on", "already off", "ledger incomplete", "not cordoned", "held", "processes",
         "an operator's instance"],
)
def test_a_request_is_answered_without_a_switch_unless_the_gpu_is_drained(
    enable: bool, gpu: GPUFacts | None, cordoned: bool, complete: bool, state: ModeState, finished: bool, fragment: str
) -> None:
    got = decide(enable, gpu, gpu_uuid=U, cordoned=cordoned, ledger_complete=complete)

    assert isinstance(got, Answer)
    assert (got.status.state, got.finished) == (state, finished)
    assert fragment in got.status.message


def test_a_drained_gpu_switches_and_leaving_mig_mode_destroys_fgpus_idle_instances_first() -> None:
    assert decide(True, IDLE_OFF, gpu_uuid=U, cordoned=True, ledger_complete=True) == Switch(enable=True)
    # A mode set before but never activated (pending) is set again: NVML says to retry once idle.
    assert decide(True, _with(IDLE_OFF, pending=True), gpu_uuid=U, cordoned=True, ledger_complete=True) == Switch(True)
    leaving = _with(IDLE_ON, instances=((MINE, True),))
    assert decide(False, leaving, gpu_uuid=U, cordoned=True, ledger_complete=True) == Switch(False, destroy=(MINE,))


@pytest.mark.parametrize(
    ("activation", "current", "state", "finished", "fragment"),
    [
        (mig_mode.NVML_SUCCESS, True, ModeState.DONE, True, "switched into MIG mode"),
        (mig_mode.NVML_ERROR_IN_USE, False, ModeState.RESET_PENDING, False, "another client holds the GPU"),
        (mig_mode.NVML_ERROR_RESET_REQUIRED, False, ModeState.RESET_PENDING, False, "next reboot of the node"),
        (999, False, ModeState.RESET_PENDING, False, "activation status 999"),
    ],
)
def test_the_activation_status_says_whether_the_new_mode_is_active(
    activation: int, current: bool, state: ModeState, finished: bool, fragment: str
) -> None:
    after = _with(IDLE_OFF, current=current, pending=True)

    got = after_set(True, after, activation=activation)

    assert (got.status.state, got.finished) == (state, finished)
    assert fragment in got.status.message


def test_the_core_knows_nvmls_return_codes() -> None:
    assert (mig_mode.NVML_SUCCESS, mig_mode.NVML_ERROR_IN_USE, mig_mode.NVML_ERROR_RESET_REQUIRED) == (
        pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_IN_USE, pynvml.NVML_ERROR_RESET_REQUIRED,
    )


@pytest.mark.parametrize(
    ("error", "state", "finished"),
    [(SetError.IN_USE, ModeState.WAITING, False), (SetError.NO_PERMISSION, ModeState.FAILED, True),
     (SetError.NOT_SUPPORTED, ModeState.FAILED, True), (SetError.OTHER, ModeState.FAILED, True)],
)
def test_a_refused_set_waits_only_when_a_retry_can_work(error: SetError, state: ModeState, finished: bool) -> None:
    got = set_failed(True, IDLE_OFF, error=error, detail="NVMLError")

    assert (got.status.state, got.finished) == (state, finished)


def test_the_status_annotation_round_trips_and_rejects_what_is_not_one() -> None:
    status = ModeStatus("enabled", ModeState.RESET_PENDING, "set, pending")
    assert decode_status(encode_status(status)) == status
    assert decode_status('{"mode":"enabled","state":"sideways","message":""}') is None
    assert decode_status("not json") is None


# --- the fake NVML's mode change, as nvml.h describes nvmlDeviceSetMigMode -------------------

def _fake(*, processes: bool = False) -> FakeNVML:
    nvml = FakeNVML(parse_inventory({"gpus": [{
        "uuid": U, "name": "NVIDIA A100-SXM4-80GB", "memory": "80Gi", "busId": "00000000:07:00.0",
        "mig": {"mode": "disabled"},
        "processes": [{"pid": 5, "usedMemory": "1Gi"}] if processes else [],
    }]}))
    nvml.nvmlInit()
    return nvml


ON, OFF = pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_DISABLE


def test_the_fake_sets_the_pending_mode_and_activates_it_only_with_a_reset_of_an_idle_gpu() -> None:
    nvml = _fake(processes=True)
    h = nvml.nvmlDeviceGetHandleByIndex(0)

    assert nvml.nvmlDeviceSetMigMode(h, ON) == pynvml.NVML_ERROR_IN_USE  # a process keeps the GPU busy
    assert nvml.nvmlDeviceGetMigMode(h) == [OFF, ON]  # set, pending

    nvml.set_usage(0, processes=())
    nvml.hold_open(0)  # DCGM holds it open
    assert nvml.nvmlDeviceSetMigMode(h, ON) == pynvml.NVML_ERROR_IN_USE
    nvml.hold_open(0, False)
    assert nvml.nvmlDeviceSetMigMode(h, ON) == pynvml.NVML_SUCCESS
    assert nvml.nvmlDeviceGetMigMode(h) == [ON, ON]


def test_the_fake_needs_a_reboot_where_the_platform_cannot_reset() -> None:
    nvml = _fake()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.needs_reboot(0)

    assert nvml.nvmlDeviceSetMigMode(h, ON) == pynvml.NVML_ERROR_RESET_REQUIRED
    assert nvml.nvmlDeviceGetMigMode(h) == [OFF, ON]
    nvml.reboot(0)
    assert nvml.nvmlDeviceGetMigMode(h) == [ON, ON]

