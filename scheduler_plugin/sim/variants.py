"""New workloads made from a trace along the axes the published variants vary (pure, seeded).

The FGD paper's variants of the Alibaba trace change one property of the default workload at a
time: how many GPU pods carry a GPU-model constraint (gpuspecNN), how many are sharing pods
(gpushareNN), how many ask for several GPUs (multigpuNN). `make_variant` does the same for any
value of four axes, so a policy can be checked on workloads it was never tuned on:

* `constrained`: share of GPU pods with a model constraint. Pods are picked uniformly among the
  GPU pods; each gets a model list drawn from the lists that occur in `constraint_source` (by
  count, so common lists stay common), among those the pod can run under on some node (a model
  of the list has a node with enough GPUs, CPU and memory for it). Lowering the share lifts the
  constraints of randomly picked constrained pods.
* `sharing`: share of GPU pods that are sharing pods (one GPU, gpu_milli < 1000). A pod turned
  into a share takes the CPU, memory and GPU share of a sharing pod drawn from the base trace; a
  share turned whole takes those of a whole 1-GPU pod drawn from it. Model constraints stay.
* `multi_gpu`: share of GPU pods asking for more than one GPU. Converted pods take the shape of a
  multi-GPU pod drawn from the base trace; whole 1-GPU pods are converted first, so the number of
  sharing pods stays as it is unless there are too few whole ones. Lowering the share turns
  multi-GPU pods into whole 1-GPU pods drawn from the base trace.
* `cpu_only`: CPU-only population as a fraction of the base's (0..3): drawn with replacement from
  the base's CPU-only pods, or randomly dropped.

Total GPU request: the axes change it (a share asks less than a whole GPU), so afterwards GPU
pods are added (clones of the variant's own GPU pods, drawn uniformly) or removed (uniformly at
random) until the total is the base trace's to within one pod's request. Drawing from the variant
itself keeps every axis' share in expectation; the shares measured after this step are reported.
The replay protocol then tunes the arrival to 1.3x capacity as for any trace.

Everything is drawn from one `numpy` generator seeded with `seed`, so a variant is reproducible.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from scheduler_plugin.sim.trace import MILLI_PER_GPU, TraceNode, TracePod

#: the axes' allowed ranges (as fractions), from the issue that asked for them
LIMITS = {"constrained": (0.0, 0.6), "sharing": (0.0, 1.0), "multi_gpu": (0.0, 0.6), "cpu_only": (0.0, 3.0)}


class VariantError(ValueError):
    """An axis value out of range, or no source to draw it from."""


@dataclass(frozen=True)
class VariantSpec:
    """Target values of the axes; None keeps the base trace's value."""

    constrained: float | None = None
    sharing: float | None = None
    multi_gpu: float | None = None
    cpu_only: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for axis, (low, high) in LIMITS.items():
            value = getattr(self, axis)
            if value is not None and not low <= value <= high:
                raise VariantError(f"variant axis {axis} = {value}; use a fraction in [{low}, {high}]")

    @property
    def label(self) -> str:
        parts = [
            f"{name}{round(value * 100)}"
            for name, value in (
                ("spec", self.constrained),
                ("share", self.sharing),
                ("multi", self.multi_gpu),
                ("cpu", self.cpu_only),
            )
            if value is not None
        ]
        return "-".join(parts) or "base"


@dataclass(frozen=True)
class WorkloadStats:
    """The axes as measured on a pod list."""

    pods: int
    gpu_pods: int
    cpu_only_pods: int
    constrained: float
    sharing: float
    multi_gpu: float
    gpu_milli: int


def is_sharing(pod: TracePod) -> bool:
    return pod.num_gpu == 1 and pod.gpu_milli < MILLI_PER_GPU


def stats(pods: Sequence[TracePod]) -> WorkloadStats:
    gpu = [p for p in pods if p.num_gpu]
    n = max(len(gpu), 1)
    return WorkloadStats(
        pods=len(pods),
        gpu_pods=len(gpu),
        cpu_only_pods=len(pods) - len(gpu),
        constrained=sum(bool(p.gpu_spec) for p in gpu) / n,
        sharing=sum(is_sharing(p) for p in gpu) / n,
        multi_gpu=sum(p.num_gpu > 1 for p in gpu) / n,
        gpu_milli=sum(p.total_gpu_milli for p in pods),
    )


def _runs_somewhere(pod: TracePod, models: tuple[str, ...], nodes: Sequence[TraceNode]) -> bool:
    return any(
        n.model in models and n.gpus >= pod.num_gpu and n.cpu_milli >= pod.cpu_milli and n.memory_mib >= pod.memory_mib
        for n in nodes
    )


def _donor(rng: np.random.Generator, pool: Sequence[TracePod], into: TracePod) -> TracePod:
    """`into` (its name and model list kept) with the resources of a pod drawn from `pool`."""
    shape = pool[int(rng.integers(len(pool)))]
    return replace(
        into, cpu_milli=shape.cpu_milli, memory_mib=shape.memory_mib, num_gpu=shape.num_gpu, gpu_milli=shape.gpu_milli
    )


def _pick(rng: np.random.Generator, indexes: Sequence[int], count: int) -> list[int]:
    if count <= 0 or not indexes:
        return []
    chosen = rng.choice(len(indexes), size=min(count, len(indexes)), replace=False)
    return [indexes[int(i)] for i in chosen]


def _set_sharing(rng: np.random.Generator, pods: list[TracePod], base: Sequence[TracePod], target: float) -> None:
    gpu = [i for i, p in enumerate(pods) if p.num_gpu]
    want = round(target * len(gpu)) - sum(is_sharing(pods[i]) for i in gpu)
    shares = [p for p in base if is_sharing(p)]
    wholes = [p for p in base if p.num_gpu == 1 and p.gpu_milli == MILLI_PER_GPU]
    if want > 0:
        if not shares:
            raise VariantError("sharing: the base trace has no sharing pod to draw shares from")
        # Whole 1-GPU pods first; multi-GPU pods only when they run out.
        singles = [i for i in gpu if pods[i].num_gpu == 1 and not is_sharing(pods[i])]
        multis = [i for i in gpu if pods[i].num_gpu > 1]
        for i in _pick(rng, singles, want) + _pick(rng, multis, want - len(singles)):
            pods[i] = _donor(rng, shares, pods[i])
    elif want < 0:
        if not wholes:
            raise VariantError("sharing: the base trace has no whole 1-GPU pod to draw from")
        for i in _pick(rng, [i for i in gpu if is_sharing(pods[i])], -want):
            pods[i] = _donor(rng, wholes, pods[i])


def _set_multi(rng: np.random.Generator, pods: list[TracePod], base: Sequence[TracePod], target: float) -> None:
    gpu = [i for i, p in enumerate(pods) if p.num_gpu]
    want = round(target * len(gpu)) - sum(pods[i].num_gpu > 1 for i in gpu)
    multis = [p for p in base if p.num_gpu > 1]
    wholes = [p for p in base if p.num_gpu == 1 and p.gpu_milli == MILLI_PER_GPU]
    if want > 0:
        if not multis:
            raise VariantError("multi_gpu: the base trace has no multi-GPU pod to draw from")
        whole = [i for i in gpu if pods[i].num_gpu == 1 and not is_sharing(pods[i])]
        shared = [i for i in gpu if is_sharing(pods[i])]
        for i in _pick(rng, whole, want) + _pick(rng, shared, want - len(whole)):
            pods[i] = _donor(rng, multis, pods[i])
    elif want < 0:
        if not wholes:
            raise VariantError("multi_gpu: the base trace has no whole 1-GPU pod to draw from")
        for i in _pick(rng, [i for i in gpu if pods[i].num_gpu > 1], -want):
            pods[i] = _donor(rng, wholes, pods[i])


def _set_constrained(
    rng: np.random.Generator,
    pods: list[TracePod],
    source: Sequence[TracePod],
    nodes: Sequence[TraceNode],
    target: float,
) -> None:
    gpu = [i for i, p in enumerate(pods) if p.num_gpu]
    want = round(target * len(gpu)) - sum(bool(pods[i].gpu_spec) for i in gpu)
    if want < 0:
        for i in _pick(rng, [i for i in gpu if pods[i].gpu_spec], -want):
            pods[i] = replace(pods[i], gpu_spec=())
        return
    lists = Counter(p.gpu_spec for p in source if p.num_gpu and p.gpu_spec)
    if want > 0 and not lists:
        raise VariantError(
            "constrained: no GPU pod of the constraint source has a gpu_spec; draw the lists from a trace that has "
            "some (e.g. openb_pod_list_gpuspec20.csv)"
        )
    specs = sorted(lists)
    counts = np.array([lists[s] for s in specs], dtype=np.float64)
    free = [i for i in gpu if not pods[i].gpu_spec]
    for i in _pick(rng, free, want):
        ok = np.array([_runs_somewhere(pods[i], s, nodes) for s in specs])
        if not ok.any():
            continue  # no listed constraint lets this pod run; leave it free rather than make it unplaceable
        weights = np.where(ok, counts, 0.0)
        pods[i] = replace(pods[i], gpu_spec=specs[int(rng.choice(len(specs), p=weights / weights.sum()))])


def _set_cpu_only(rng: np.random.Generator, pods: list[TracePod], base: Sequence[TracePod], factor: float) -> list[TracePod]:
    cpu_only = [p for p in base if not p.num_gpu]
    kept = [i for i, p in enumerate(pods) if not p.num_gpu]
    want = round(factor * len(cpu_only)) - len(kept)
    if want < 0:
        drop = set(_pick(rng, kept, -want))
        return [p for i, p in enumerate(pods) if i not in drop]
    if want > 0 and not cpu_only:
        raise VariantError("cpu_only: the base trace has no CPU-only pod to draw from")
    names = _unused_names("variant-cpu", pods)
    extra = [replace(cpu_only[int(rng.integers(len(cpu_only)))], name=next(names)) for _ in range(max(want, 0))]
    return pods + extra


def _unused_names(prefix: str, pods: Sequence[TracePod]) -> Iterator[str]:
    """`prefix-00000`, `prefix-00001`, ... skipping names `pods` already use (a variant of a variant)."""
    taken = {p.name for p in pods}
    for k in itertools.count():
        name = f"{prefix}-{k:05d}"
        if name not in taken:
            yield name


def _rebalance(rng: np.random.Generator, pods: list[TracePod], total: int) -> list[TracePod]:
    """Adds clones of the GPU pods or drops random ones until the GPU request is `total` to within a pod."""
    gpu = [p for p in pods if p.num_gpu]
    now = sum(p.total_gpu_milli for p in gpu)
    if now < total:
        extra: list[TracePod] = []
        names = _unused_names("variant-gpu", pods)
        while now < total:
            pick = gpu[int(rng.integers(len(gpu)))]
            if now + pick.total_gpu_milli > total and total - now < pick.total_gpu_milli / 2:
                break  # closer to the target without it
            extra.append(replace(pick, name=next(names)))
            now += pick.total_gpu_milli
        return pods + extra
    drop: set[int] = set()
    gpu_index = [i for i, p in enumerate(pods) if p.num_gpu]
    for i in rng.permutation(len(gpu_index)):
        if now <= total:
            break
        index = gpu_index[int(i)]
        request = pods[index].total_gpu_milli
        if now - request < total and total - (now - request) > now - total:
            continue  # dropping this one would overshoot further than keeping it
        drop.add(index)
        now -= request
    return [p for i, p in enumerate(pods) if i not in drop]


def make_variant(
    base: Sequence[TracePod],
    *,
    nodes: Sequence[TraceNode],
    spec: VariantSpec,
    constraint_source: Sequence[TracePod] | None = None,
) -> list[TracePod]:
    """The base trace with the axes of `spec` set; see the module docstring for the rules."""
    rng = np.random.default_rng(spec.seed)
    pods = sorted(base, key=lambda p: p.name)
    total = sum(p.total_gpu_milli for p in pods)
    if spec.sharing is not None:
        _set_sharing(rng, pods, base, spec.sharing)
    if spec.multi_gpu is not None:
        _set_multi(rng, pods, base, spec.multi_gpu)
    if spec.cpu_only is not None:
        pods = _set_cpu_only(rng, pods, base, spec.cpu_only)
    pods = _rebalance(rng, pods, total)
    if spec.constrained is not None:
        # Last, so the share holds exactly on the final GPU pods.
        _set_constrained(rng, pods, base if constraint_source is None else constraint_source, nodes, spec.constrained)
    return pods
