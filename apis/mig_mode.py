"""The agent's answer to a MIG mode request, as it travels on the Node.

`fgpuctl mig enable|disable NODE GPU` asks with `fgpu.io/mig-mode.<GPU UUID>`
(`apis.mig.mode_request_key`); the node's agent answers in
`fgpu.io/mig-mode-status.<GPU UUID>` (`status_key`) with a `ModeStatus`, rewritten
whenever the answer changes, and posts an Event on the Node with it. Example::

    fgpu.io/mig-mode-status.GPU-5e1d0a7c-3b1f-4c6e-9a2d-7f0e1b2c3d40:
      {"message":"GPU 0 is held by pod ml/train-0; ...","mode":"enabled","state":"waiting"}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from apis import names


class ModeState(Enum):
    """Where a request stands; the comment says what the agent does next."""

    #: The GPU is in the mode asked. The request key is removed; nothing more happens.
    DONE = "done"
    #: Not acted on yet (the GPU is busy, the node not cordoned, ...); the message says why.
    #: Looked at again on every pass while the request stands.
    WAITING = "waiting"
    #: The mode is set but not active: the GPU reset NVML attempts did not happen (another client
    #: holds the GPU, or the platform needs a reboot). Set again on every pass while the request stands.
    RESET_PENDING = "reset-pending"
    #: NVML refused in a way a retry does not fix (no MIG support, no permission, no such GPU).
    #: The request key is removed; fix the cause and run fgpuctl mig again.
    FAILED = "failed"


@dataclass(frozen=True)
class ModeStatus:
    """The agent's answer to one GPU's request: the mode asked, where it stands, and why, in words."""

    mode: str
    state: ModeState
    message: str


def status_key(gpu_uuid: str) -> str:
    """The Node annotation that holds the agent's answer to the MIG mode request of GPU `gpu_uuid`."""
    return f"{names.MIG_MODE_STATUS_PREFIX}{gpu_uuid}"


def encode_status(status: ModeStatus) -> str:
    return json.dumps({"mode": status.mode, "state": status.state.value, "message": status.message}, sort_keys=True)


def decode_status(raw: str) -> ModeStatus | None:
    """The answer in an annotation value; None for one that is not an answer (hand-edited, truncated)."""
    try:
        data = json.loads(raw)
        return ModeStatus(mode=str(data["mode"]), state=ModeState(data["state"]), message=str(data["message"]))
    except (ValueError, TypeError, KeyError):
        return None


def statuses(annotations: Mapping[str, str]) -> dict[str, ModeStatus]:
    """GPU UUID -> the agent's answer, from a Node's annotations."""
    out = {}
    for key, value in annotations.items():
        if key.startswith(names.MIG_MODE_STATUS_PREFIX) and (status := decode_status(value)) is not None:
            out[key.removeprefix(names.MIG_MODE_STATUS_PREFIX)] = status
    return out
