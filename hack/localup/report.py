"""What the demo prints: one row per pod, from its placement and its containers' logs.

A pod with more than one container (init containers count) gets a row of its
own and then one row per container, with what that container saw: a sidecar
of a GPU pod shows its own `void`.

Pure functions over plain values, so the table is tested without a stack.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from apis import names

GI = 1024**3
MI = 1024**2


class Status(enum.Enum):
    """How a pod ended in the demo."""

    COMPLETED = "Completed"  # the container ran and exited 0
    FAILED = "Failed"  # placed, but the runtime refused or the container failed
    PENDING = "Pending"  # the scheduler found no room; `reason` says why


class ContainerState(enum.Enum):
    """How far one container got."""

    STARTED = "Started"  # created and started, not looked at since
    EXITED = "Exited"  # ran and exited; `exit_code` says how
    RUNNING = "Running"  # left running on purpose (a long-running container)
    REFUSED = "Refused"  # CreateContainer or StartContainer failed; `error` says why
    NOT_RUN = "NotRun"  # never tried: an init container before it did not complete


@dataclass(frozen=True)
class ContainerOutcome:
    """One container of a pod: its own environment, as it printed it, and how it ended."""

    name: str
    state: ContainerState
    init: bool = False
    container_id: str = ""
    exit_code: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    #: every line it wrote (stdout and stderr), for what is not an env variable
    output: tuple[str, ...] = ()
    #: the runtime's words when a CRI call failed, and the gRPC code's name ("UNAVAILABLE")
    error: str = ""
    error_code: str = ""

    @property
    def succeeded(self) -> bool:
        return self.state is ContainerState.EXITED and self.exit_code == 0

    def describe(self) -> str:
        """"exit 0", "running", "refused: <why>", "not run"."""
        if self.state is ContainerState.EXITED:
            return f"exit {self.exit_code}"
        if self.state is ContainerState.REFUSED:
            return f"refused: {self.error_code}: {self.error}" if self.error_code else f"refused: {self.error}"
        return {ContainerState.RUNNING: "running", ContainerState.STARTED: "started"}.get(self.state, "not run")

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "init": self.init,
            "state": self.state.value,
            "containerId": self.container_id,
            "exitCode": self.exit_code,
            "env": dict(self.env),
            "error": self.error,
            "errorCode": self.error_code,
        }


@dataclass(frozen=True)
class Share:
    """One GPU of a placement, as the scheduler's BindResponse lists it."""

    minor: int
    uuid: str
    core_percent: int
    memory_bytes: int


@dataclass(frozen=True)
class PodOutcome:
    """Everything the table shows about one pod."""

    name: str
    namespace: str
    status: Status
    node: str = ""
    shares: tuple[Share, ...] = ()
    #: the env of the pod's first app container (every container's own is in `containers`)
    env: Mapping[str, str] = field(default_factory=dict)
    reason: str = ""
    #: the translation rule / request style, e.g. "koordinator", "hami"; "" for no GPU
    source: str = ""
    #: runtime ids, for `ctr`/`crictl` and for checking that nothing is left running
    sandbox_id: str = ""
    container_ids: tuple[str, ...] = ()
    #: init containers in order, then app containers in order
    containers: tuple[ContainerOutcome, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "namespace": self.namespace,
            "status": self.status.value,
            "node": self.node,
            "gpus": [
                {"minor": s.minor, "uuid": s.uuid, "corePercent": s.core_percent, "memoryBytes": s.memory_bytes}
                for s in self.shares
            ],
            "env": dict(self.env),
            "reason": self.reason,
            "source": self.source,
            "sandboxId": self.sandbox_id,
            "containerIds": list(self.container_ids),
            "containers": [c.to_json() for c in self.containers],
        }


def parse_cri_log(text: str) -> list[str]:
    """The lines a container wrote, from a CRI log file ("<time> <stream> <F|P> <text>").

    Partial lines (P) are joined with what follows, as kubelet does.
    """
    lines: list[str] = []
    partial = ""
    for raw in text.splitlines():
        parts = raw.split(" ", 3)
        if len(parts) < 3:
            continue
        tag = parts[2]
        content = parts[3] if len(parts) == 4 else ""
        if tag == "P":
            partial += content
            continue
        lines.append(partial + content)
        partial = ""
    if partial:
        lines.append(partial)
    return lines


def env_from_lines(lines: Iterable[str]) -> dict[str, str]:
    """`env` output as a mapping; lines without "=" (a multi-line value's tail) are skipped."""
    env: dict[str, str] = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key and " " not in key:
            env[key] = value
    return env


def describe_shares(shares: Sequence[Share]) -> str:
    """`0 (50%, 40Gi)` for a share, `2,3,4,5 (whole)` for whole GPUs; "-" for none."""
    if not shares:
        return "-"
    if all(s.core_percent >= 100 for s in shares):
        return ",".join(str(s.minor) for s in shares) + " (whole)"
    return ", ".join(f"{s.minor} ({s.core_percent}%, {human_bytes(s.memory_bytes)})" for s in shares)


def human_bytes(value: int) -> str:
    if value >= GI and value % GI == 0:
        return f"{value // GI}Gi"
    if value >= GI:
        return f"{value / GI:.1f}Gi"
    return f"{value // MI}Mi"


def memory_limit(env: Mapping[str, str]) -> str:
    """The memory limit the isolation backend enforces, as the container sees it.

    HAMi-core's per-GPU variables first, then MPS's, then fgpu's informative
    bytes (whole GPUs, and backend `none`, get no limit but still say what
    was allocated). Identical per-GPU values are written once.
    """
    hami = sorted(
        ((int(k.removeprefix(names.HAMI_MEMORY_LIMIT_PREFIX)), v) for k, v in env.items()
         if k.startswith(names.HAMI_MEMORY_LIMIT_PREFIX) and k.removeprefix(names.HAMI_MEMORY_LIMIT_PREFIX).isdigit()),
    )
    if hami:
        values = {v for _, v in hami}
        if len(hami) > 1 and len(values) == 1:
            return f"{names.HAMI_MEMORY_LIMIT_PREFIX}{{{hami[0][0]}..{hami[-1][0]}}}={hami[0][1]}"
        return " ".join(f"{names.HAMI_MEMORY_LIMIT_PREFIX}{i}={v}" for i, v in hami)
    if names.MPS_PINNED_MEM_LIMIT in env:
        return f"{names.MPS_PINNED_MEM_LIMIT}={env[names.MPS_PINNED_MEM_LIMIT]}"
    if names.FGPU_MEMORY_BYTES in env:
        per_gpu = env[names.FGPU_MEMORY_BYTES].split(",")
        if len(per_gpu) > 1 and len(set(per_gpu)) == 1:
            return f"{names.FGPU_MEMORY_BYTES}={per_gpu[0]} (x{len(per_gpu)})"
        return f"{names.FGPU_MEMORY_BYTES}={env[names.FGPU_MEMORY_BYTES]}"
    return "-"


def short_devices(value: str) -> str:
    """GPU and MIG UUIDs cut to their first block ("GPU-74106407"), which is unique enough to read."""
    parts = value.split(",")
    if not all(p.startswith(("GPU-", "MIG-")) for p in parts):
        return value
    return ",".join(p[:12] for p in parts)


HEADERS = ("POD", "NODE GPU(S) AND SHARE", names.NVIDIA_VISIBLE_DEVICES, "MEMORY LIMIT ENV", "STATUS")


def row(outcome: PodOutcome) -> tuple[str, ...]:
    """The pod's row; with one container, that container's env fills it."""
    status = outcome.status.value
    if outcome.reason:
        status = f"{status}: {outcome.reason}"
    where = describe_shares(outcome.shares)
    if outcome.node and outcome.shares:
        where = f"{outcome.node} {where}"
    pod = f"{outcome.name} [{outcome.source}]" if outcome.source else outcome.name
    if len(outcome.containers) > 1:
        return (pod, where, "", "", status)
    visible = short_devices(outcome.env.get(names.NVIDIA_VISIBLE_DEVICES, "-"))
    return (pod, where, visible, memory_limit(outcome.env), status)


def container_row(container: ContainerOutcome) -> tuple[str, ...]:
    """One container of a pod with several, indented under the pod's row."""
    name = f"  {container.name} (init)" if container.init else f"  {container.name}"
    visible = short_devices(container.env.get(names.NVIDIA_VISIBLE_DEVICES, "-"))
    return (name, "", visible, memory_limit(container.env), container.describe())


def rows(outcome: PodOutcome) -> list[tuple[str, ...]]:
    """The pod's row, then one per container when it has more than one."""
    if len(outcome.containers) <= 1:
        return [row(outcome)]
    return [row(outcome), *(container_row(c) for c in outcome.containers)]


def table(outcomes: Sequence[PodOutcome], *, max_width: int = 72) -> str:
    """A plain-text table; long cells are cut with "..." (the JSON output has everything)."""
    all_rows = [HEADERS, *(r for o in outcomes for r in rows(o))]
    cut = [tuple(_cut(cell, max_width) for cell in r) for r in all_rows]
    widths = [max(len(r[i]) for r in cut) for i in range(len(HEADERS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in cut)


def reasons(outcomes: Sequence[PodOutcome]) -> str:
    """The full reason of every pod that did not complete (the table may have cut it)."""
    return "\n".join(f"{o.name}: {o.status.value}: {o.reason}" for o in outcomes if o.reason)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def to_json(outcomes: Sequence[PodOutcome]) -> str:
    return json.dumps({"pods": [o.to_json() for o in outcomes]}, indent=2, sort_keys=True)
