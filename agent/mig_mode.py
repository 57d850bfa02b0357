"""Whether the agent may switch a GPU into or out of MIG mode now, and what the outcome means.

Pure decisions over plain values; `agent.mig_mode_switch` reads the Node, the
ledger and NVML into them and carries the switch out (docs/mig.md, "Mode changes").

A switch happens only on an operator's request (`fgpu.io/mig-mode.<GPU UUID>`,
written by `fgpuctl mig`) and only on an idle GPU: the node cordoned, the agent's
ledger complete (every running pod counted), no pod holding the GPU, no process on
it, and, to leave MIG mode, no MIG instance left but fgpu's own idle ones, which go
first. Anything else is answered with why, and looked at again on the next pass.

NVML's `nvmlDeviceSetMigMode` sets the *pending* mode and then tries to activate it
by resetting the GPU; its activation status says whether that worked (NVML_SUCCESS),
whether another client kept the GPU busy (NVML_ERROR_IN_USE: stop it and retry), or
whether only a reboot activates it (NVML_ERROR_RESET_REQUIRED: pass-through VMs).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from agent.mig_manager import Instance
from apis import names
from apis.mig_mode import ModeState, ModeStatus

#: NVML return codes an activation status can hold (nvml.h).
NVML_SUCCESS = 0
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_IN_USE = 19


@dataclass(frozen=True)
class GPUFacts:
    """One GPU as NVML and the ledger show it now."""

    uuid: str
    index: int
    #: NVML answers MIG calls for it (nvmlDeviceGetMigMode does not say NotSupported).
    supported: bool
    current: bool
    pending: bool
    #: Pods the admission ledger says hold a share, MIG instance or whole GPU of it.
    holders: tuple[str, ...] = ()
    processes: int = 0
    #: Its MIG instances, with whether each is fgpu's (the record NVML confirms).
    instances: tuple[tuple[Instance, bool], ...] = ()


@dataclass(frozen=True)
class Switch:
    """Set the mode; `destroy` first: fgpu's idle instances on a GPU leaving MIG mode."""

    enable: bool
    destroy: tuple[Instance, ...] = ()


@dataclass(frozen=True)
class Answer:
    """Nothing to do now: the status to write, and whether the request is finished (its key removed)."""

    status: ModeStatus
    finished: bool = False


class SetError(Enum):
    """How `nvmlDeviceSetMigMode` itself failed (before any activation)."""

    #: Instances or processes appeared since the check: try again later.
    IN_USE = "in use"
    NOT_SUPPORTED = "not supported"
    NO_PERMISSION = "no permission"
    OTHER = "other"


def mode_word(enable: bool) -> str:
    return names.MIG_MODE_ENABLED if enable else names.MIG_MODE_DISABLED


def _in_or_out(enable: bool) -> str:
    return "into" if enable else "out of"


def decide(enable: bool, gpu: GPUFacts | None, *, gpu_uuid: str, cordoned: bool, ledger_complete: bool) -> Switch | Answer:
    """What to do about a request to switch GPU `gpu_uuid` into (`enable`) or out of MIG mode."""
    mode = mode_word(enable)

    def answer(state: ModeState, message: str, *, finished: bool = False) -> Answer:
        return Answer(ModeStatus(mode=mode, state=state, message=message), finished=finished)

    if gpu is None:
        return answer(ModeState.FAILED, f"this node has no GPU {gpu_uuid}; check the UUID with fgpuctl inspect", finished=True)
    what = f"GPU {gpu.index} ({gpu.uuid})"
    if not gpu.supported:
        return answer(ModeState.FAILED, f"{what} does not support MIG (NVML: not supported)", finished=True)
    if gpu.current == enable and gpu.pending == enable:
        return answer(ModeState.DONE, f"{what} is {'in' if enable else 'out of'} MIG mode", finished=True)
    wait = f"{what} is not switched {_in_or_out(enable)} MIG mode yet: "
    if not ledger_complete:
        return answer(ModeState.WAITING, wait + "the agent has not yet counted the pods running on the node; it retries")
    if not cordoned:
        return answer(
            ModeState.WAITING,
            wait + "the node is not cordoned, so a pod could land on the GPU; run kubectl cordon (the switch "
            "happens at the agent's next pass)",
        )
    if gpu.holders:
        return answer(ModeState.WAITING, wait + f"pods hold it ({', '.join(sorted(gpu.holders))}); drain them")
    if gpu.processes:
        return answer(
            ModeState.WAITING,
            wait + f"{gpu.processes} process(es) run on it (nvidia-smi shows them); stop them",
        )
    destroy: tuple[Instance, ...] = ()
    if not enable:
        theirs = [i for i, mine in gpu.instances if not mine]
        if theirs:
            listed = ", ".join(f"{i.profile} at {i.placement_start} (GPU instance {i.gi_id})" for i in theirs)
            return answer(
                ModeState.WAITING,
                wait + f"it holds MIG instances fgpu did not create ({listed}); fgpu never destroys an operator's "
                "instances: destroy them (nvidia-smi mig -dci, -dgi)",
            )
        destroy = tuple(i for i, _ in gpu.instances)
    return Switch(enable=enable, destroy=destroy)


def after_set(enable: bool, gpu: GPUFacts, *, activation: int) -> Answer:
    """The answer once `nvmlDeviceSetMigMode` returned `activation` and NVML shows `gpu` (read again)."""
    mode = mode_word(enable)
    what = f"GPU {gpu.index} ({gpu.uuid})"
    if gpu.current == enable:
        return Answer(ModeStatus(mode, ModeState.DONE, f"{what} switched {_in_or_out(enable)} MIG mode"), finished=True)
    if activation == NVML_ERROR_RESET_REQUIRED:
        message = (
            f"{what}: MIG mode {mode} is set but pending; this platform (e.g. GPU pass-through to a VM) cannot "
            "reset the GPU itself, so it takes effect at the next reboot of the node (NVML: reset required)"
        )
    elif activation == NVML_ERROR_IN_USE:
        message = (
            f"{what}: MIG mode {mode} is set but pending: the GPU reset that activates it failed because another "
            "client holds the GPU (NVML: in use). Stop the services that keep GPUs open (NVIDIA's guide names "
            "DCGM/nv-hostengine and NVSM), or reboot the node; the agent sets it again on every pass"
        )
    else:
        message = f"{what}: MIG mode {mode} is set but pending (activation status {activation}); the agent sets it again on every pass"
    return Answer(ModeStatus(mode, ModeState.RESET_PENDING, message))


def set_failed(enable: bool, gpu: GPUFacts, *, error: SetError, detail: str) -> Answer:
    """The answer when `nvmlDeviceSetMigMode` raised."""
    mode = mode_word(enable)
    what = f"GPU {gpu.index} ({gpu.uuid})"
    if error is SetError.IN_USE:
        return Answer(ModeStatus(mode, ModeState.WAITING, f"{what}: NVML refused the switch, the GPU is in use ({detail}); the agent retries"))
    if error is SetError.NO_PERMISSION:
        why = "the agent lacks the permission (it must run as root, as the chart's DaemonSet does)"
    elif error is SetError.NOT_SUPPORTED:
        why = "NVML does not support MIG mode changes on it"
    else:
        why = "NVML refused"
    return Answer(ModeStatus(mode, ModeState.FAILED, f"{what}: cannot switch to MIG mode {mode}: {why} ({detail})"), finished=True)
