"""Verdicts on a hooked call, as pure functions over plain values: what the hooks' outcomes come to.

- A pod labelled as a hook server (in an allowed namespace) bypasses hooks, so
  the agent running as a pod cannot deadlock its own creation.
- A container whose pod carries a GPU allocation is never created without
  the hooks' answers: a hook that fails or times out, or no hook registered
  at all, refuses CreateContainer (fail-closed), whatever the hook's
  failurePolicy says. kubelet retries, and the retry goes through once the
  hook is back.
- Otherwise a failed hook refuses the call when its failurePolicy is Fail and
  is skipped when it is Ignore; any hook's rejection refuses a Pre* call.
- A GPU pod whose hooks all answered but none set NVIDIA_VISIBLE_DEVICES (or CDI
  devices) is refused too: its GPU settings would be missing.
- Unless a hook set NVIDIA_VISIBLE_DEVICES, the container gets `void`, so
  neither the image (CUDA images bake in `all`) nor the pod spec can hand a
  container GPUs the scheduler did not give it.

A hook *rejects* a call (its answer's `rejection`); the proxy *refuses* it
(answers kubelet itself): `Judgement.refusal` is the proxy's message.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import grpc

from apis import names
from apis.allocation import lists_gpus
from apis.container_edits import ContainerEdits
from runtimeproxy.errors import grpc_code
from runtimeproxy.hookconfig import FailurePolicy
from runtimeproxy.stages import Stage

#: the stage whose hooks give a container its GPUs (hooks.proto): GPU pods are fail-closed there
GPU_STAGE = "PreCreateContainer"


@dataclass(frozen=True)
class PodFacts:
    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def has_allocation(pod: PodFacts) -> bool:
    """A GPU pod: its allocation lists a GPU (or cannot be read, so the hook rejects it with the reason)."""
    return lists_gpus(pod.annotations.get(names.DEVICE_ALLOCATED))


def bypasses_hooks(pod: PodFacts, *, hook_server_namespaces: Collection[str]) -> bool:
    """True for a hook server's own pod: labelled, and in an allowed namespace.

    An empty list allows none: the label skips every hook and the `void` rule, so honouring
    it everywhere must be asked for explicitly with "*".
    """
    if pod.labels.get(names.HOOK_SERVER_LABEL, "").lower() != "true":
        return False
    return "*" in hook_server_namespaces or pod.namespace in hook_server_namespaces


class OutcomeKind(enum.Enum):
    EDITS = enum.auto()
    REJECTED = enum.auto()
    FAILED = enum.auto()


@dataclass(frozen=True)
class HookOutcome:
    """What one hook server's call came to."""

    server: str
    policy: FailurePolicy
    kind: OutcomeKind
    edits: ContainerEdits = field(default_factory=ContainerEdits)
    #: the rejection reason or the failure
    detail: str = ""


@dataclass(frozen=True)
class Judgement:
    """Go on with `edits` (in order), or refuse with `code` and `refusal`."""

    edits: tuple[ContainerEdits, ...] = ()
    refusal: str | None = None
    code: int = 0
    #: failures that were skipped (Ignore policy), for logs
    ignored: tuple[str, ...] = ()


def stop_early(stage: Stage, outcome: HookOutcome, *, allocation: bool) -> bool:
    """Whether calling later hooks is pointless because this outcome already refuses the call."""
    judgement = judge(stage, outcomes=(outcome,), registered=1, allocation=allocation, complete=False)
    return judgement.refusal is not None


def judge(
    stage: Stage, *, outcomes: Sequence[HookOutcome], registered: int, allocation: bool, complete: bool = True
) -> Judgement:
    """Folds the hook outcomes of one call (in call order) into what happens to it.

    `complete=False` judges a prefix of the outcomes (a later hook may still supply
    the GPU settings), so only refusals that no later answer can undo count.
    """
    pre = stage.pre
    gpu_gate = allocation and stage.name == GPU_STAGE
    if gpu_gate and registered == 0:
        return Judgement(
            refusal=(
                "fgpu-runtime-proxy: the pod carries a GPU allocation but no hook server is registered for "
                "PreCreateContainer; the container is not created without its GPU settings. Register fgpu-agent "
                "in the proxy's hook config directory; kubelet retries."
            ),
            code=grpc_code(grpc.StatusCode.UNAVAILABLE),
        )
    edits: list[ContainerEdits] = []
    ignored: list[str] = []
    for outcome in outcomes:
        if outcome.kind is OutcomeKind.EDITS:
            edits.append(outcome.edits)
        elif outcome.kind is OutcomeKind.REJECTED:
            if pre:
                return Judgement(
                    refusal=f"fgpu-runtime-proxy: hook server {outcome.server!r} rejected {stage.name}: {outcome.detail}",
                    code=grpc_code(grpc.StatusCode.FAILED_PRECONDITION),
                )
            ignored.append(f"{outcome.server}: rejected: {outcome.detail}")
        elif gpu_gate:
            return Judgement(
                refusal=(
                    f"fgpu-runtime-proxy: the pod carries a GPU allocation and hook server {outcome.server!r} failed "
                    f"({outcome.detail}); the container is not created without its GPU settings. kubelet retries; "
                    "it goes through once the hook server answers."
                ),
                code=grpc_code(grpc.StatusCode.UNAVAILABLE),
            )
        elif pre and outcome.policy is FailurePolicy.FAIL:
            return Judgement(
                refusal=(
                    f"fgpu-runtime-proxy: hook server {outcome.server!r} failed ({outcome.detail}) and its "
                    f"failurePolicy is Fail, so {stage.name} is refused; kubelet retries."
                ),
                code=grpc_code(grpc.StatusCode.UNAVAILABLE),
            )
        else:
            ignored.append(f"{outcome.server}: {outcome.detail}")
    if gpu_gate and complete and not (hooks_set_visible_devices(edits) or any(e.cdi_devices for e in edits)):
        # Every hook answered, yet none gave the container its GPUs: creating it would
        # run a pod the scheduler gave GPUs to with `void` (or the image's `all`).
        return Judgement(
            refusal=(
                "fgpu-runtime-proxy: the pod carries a GPU allocation but no hook server set "
                f"{names.NVIDIA_VISIBLE_DEVICES} or CDI devices for it; the container is not created without its "
                "GPU settings. Check that fgpu-agent is registered for PreCreateContainer in the proxy's hook "
                "config directory; kubelet retries."
            ),
            code=grpc_code(grpc.StatusCode.FAILED_PRECONDITION),
        )
    return Judgement(edits=tuple(edits) if pre else (), ignored=tuple(ignored))


def hooks_set_visible_devices(edits: Sequence[ContainerEdits]) -> bool:
    """Whether NVIDIA_VISIBLE_DEVICES, after every hook's edits in order, is a value a hook set.

    A later hook's unset undoes an earlier hook's set; left unset, containerd would fall back
    to the image's baked-in `all`. Within one answer the set applies after the unset.
    """
    present = False
    for e in edits:
        if names.NVIDIA_VISIBLE_DEVICES in e.unset_envs:
            present = False
        if e.sets_env(names.NVIDIA_VISIBLE_DEVICES):
            present = True
    return present


def needs_void(edits: Sequence[ContainerEdits], *, force_void: bool) -> bool:
    """Whether the proxy sets NVIDIA_VISIBLE_DEVICES=void: on, and no hook left the variable set."""
    return force_void and not hooks_set_visible_devices(edits)
