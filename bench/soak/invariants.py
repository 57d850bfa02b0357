"""The promises, checked from outside the daemons: containers' own env, API objects, inventories.

Pure functions over what the runner gathered; each returns violations as
dicts (`invariant`, `detail`, and the pod/node/GPU to look at). The runner adds
the seed, step and time.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.soak import adapter
from bench.soak.kubelet import SeenContainer
from bench.soak.stack import GPU

MIB = 2**20
Violation = dict[str, Any]
#: (uid, node, annotations) -> the verified shares, or None
Verifier = Callable[[str, str, Mapping[str, str]], "tuple[adapter.Share, ...] | None"]


@dataclass(frozen=True)
class Given:
    """What one running container received, read from its env."""

    uuids: tuple[str, ...]
    core: tuple[int, ...]
    memory: tuple[int, ...]


def given(env: Mapping[str, str]) -> Given | None:
    visible = env.get(adapter.VISIBLE, "")
    if visible in ("", adapter.VOID, "none"):
        return None
    uuids = tuple(u for u in visible.split(",") if u)

    def ints(name: str) -> tuple[int, ...]:
        try:
            return tuple(int(x) for x in env.get(name, "").split(",") if x)
        except ValueError:
            return ()

    return Given(uuids=uuids, core=ints(adapter.ENV_CORE), memory=ints(adapter.ENV_MEMORY))


def _requests_gpu(pod: Mapping[str, Any], container: str) -> bool:
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") == container:
            limits = (c.get("resources") or {}).get("limits") or {}
            return any(k in limits for k in (adapter.GPU_CORE, adapter.GPU_MEMORY_RATIO, adapter.NVIDIA_GPU))
    return False


def _ref(c: SeenContainer) -> dict[str, Any]:
    meta = c.pod["metadata"]
    return {"node": c.node, "pod": meta["name"], "uid": meta["uid"], "container": c.container,
            "kind": (meta.get("labels") or {}).get("fgpu.soak/kind", "")}


def check_containers(
    containers: Sequence[SeenContainer], *, gpus: Mapping[str, Sequence[GPU]], verify: Verifier, isolation: str,
) -> list[Violation]:
    """Visibility, limits, forged/edited allocations and over-commit, for the containers running now."""
    out: list[Violation] = []
    use: dict[tuple[str, str], list[tuple[int, int, dict[str, Any]]]] = collections.defaultdict(list)
    for c in containers:
        ref = _ref(c)
        got = given(c.env)
        verified = verify(ref["uid"], c.node, c.annotations)
        if got is None:
            continue
        wanted = _requests_gpu(c.pod, c.container)
        if not wanted or verified is None:
            why = "asked for no GPU" if not wanted else "its pod carries no allocation that verifies (forged/edited/none)"
            out.append({"invariant": "no-unallocated-gpu", **ref,
                        "detail": f"{adapter.VISIBLE}={c.env.get(adapter.VISIBLE)} but the container {why}",
                        "annotations": dict(c.annotations)})
            continue
        node_gpus = {g.uuid: g for g in gpus.get(c.node, ())}
        allowed = {s.uuid: s for s in verified}
        for i, uuid in enumerate(got.uuids):
            if uuid not in node_gpus or uuid not in allowed:
                out.append({"invariant": "no-unallocated-gpu", **ref, "gpu": uuid,
                            "detail": f"sees {uuid}, allocation lists {sorted(allowed)}"})
                continue
            core = got.core[i] if i < len(got.core) else -1
            memory = got.memory[i] if i < len(got.memory) else -1
            if core < 0 or memory < 0 or core > allowed[uuid].core_percent or memory > allowed[uuid].memory_bytes:
                out.append({"invariant": "share-within-allocation", **ref, "gpu": uuid,
                            "detail": f"env core={core} memory={memory}, signed share core="
                                      f"{allowed[uuid].core_percent} memory={allowed[uuid].memory_bytes}"})
            use[c.node, uuid].append((max(core, 0), max(memory, 0), ref))
            if isolation == "hami-core" and 0 <= core < 100:
                limit = c.env.get(f"{adapter.HAMI_MEMORY_PREFIX}{i}")
                sm = c.env.get(adapter.HAMI_SM_LIMIT) or c.env.get(f"{adapter.HAMI_SM_LIMIT}_{i}")
                if limit != f"{memory // MIB}m" or sm is None:
                    out.append({"invariant": "share-has-limits", **ref, "gpu": uuid,
                                "detail": f"{adapter.HAMI_MEMORY_PREFIX}{i}={limit!r} (want {memory // MIB}m), "
                                          f"{adapter.HAMI_SM_LIMIT}={sm!r}"})
    for (node, uuid), shares in use.items():
        capacity = next((g.memory_bytes for g in gpus.get(node, ()) if g.uuid == uuid), 0)
        core = sum(s[0] for s in shares)
        memory = sum(s[1] for s in shares)
        if core > 100 or memory > capacity:
            out.append({"invariant": "no-overcommit", "node": node, "gpu": uuid,
                        "detail": f"containers running on it hold core={core}% memory={memory} of {capacity}",
                        "holders": [s[2] for s in shares]})
    return out


def gpu_request(pod: Mapping[str, Any]) -> tuple[int, int, int]:
    """(GPUs, core % per GPU, memory-ratio % per GPU) the pod's app containers ask for; (0, 0, 0) for none."""
    limits: dict[str, Any] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        limits.update((c.get("resources") or {}).get("limits") or {})
    whole = int(limits.get(adapter.NVIDIA_GPU, 0) or 0)
    if whole:
        return whole, 100, 100
    core = int(limits.get(adapter.GPU_CORE, 0) or 0)
    ratio = int(limits.get(adapter.GPU_MEMORY_RATIO, 0) or 0)
    return (1, core, ratio or core) if core or ratio else (0, 0, 0)


def fits(pod: Mapping[str, Any], free: Mapping[str, Mapping[str, tuple[int, int]]]) -> bool:
    """Whether a pending pod's GPU request fits the free (core %, memory-ratio %) per node and GPU."""
    gpus, core, ratio = gpu_request(pod)
    if not gpus:
        return True
    return any(sum(1 for c, r in node.values() if c >= core and r >= ratio) >= gpus for node in free.values())


@dataclass(frozen=True)
class Claim:
    """A bound pod whose allocation does not verify (forged, replayed, edited): fgpu-scheduler by design still
    counts its *request* (or its last verified allocation, which is that request) on the GPUs its annotation
    names, at most one entry per GPU and as many GPUs as it asks for, each cut to what verified pods leave free
    (scheduler_plugin/boundpods.py). The pod runs there, so that capacity is not free."""

    node: str
    uuids: tuple[str, ...]
    gpus: int
    core: int
    ratio: int


def claim_of(node: str, pod: Mapping[str, Any]) -> Claim | None:
    """The claim of a bound pod whose allocation does not verify; None when it asks for no GPU."""
    gpus, core, ratio = gpu_request(pod)
    named = adapter.allocation_shares((pod.get("metadata") or {}).get("annotations") or {}) or ()
    if not gpus or not named:
        return None
    return Claim(node=node, uuids=tuple(dict.fromkeys(s.uuid for s in named)), gpus=gpus, core=core, ratio=ratio)


def free_capacity(
    bound: Iterable[tuple[str, Sequence[adapter.Share]]], gpus: Mapping[str, Sequence[GPU]], lost: set[tuple[str, str]],
    claims: Iterable[Claim] = (),
) -> dict[str, dict[str, tuple[int, int]]]:
    """Free (core %, memory-ratio %) per node and healthy GPU: verified allocations first, then the claims
    of pods whose allocation does not verify, each cut to what is left, as the scheduler counts them."""
    free = {node: {g.uuid: (100, 100) for g in gs if (node, g.uuid) not in lost} for node, gs in gpus.items()}
    memory = {(node, g.uuid): g.memory_bytes for node, gs in gpus.items() for g in gs}
    for node, shares in bound:
        for s in shares:
            if s.uuid in free.get(node, {}):
                core, ratio = free[node][s.uuid]
                used_ratio = -(-s.memory_bytes * 100 // max(memory.get((node, s.uuid), 1), 1))
                free[node][s.uuid] = (core - s.core_percent, ratio - used_ratio)
    for claim in claims:
        node_free = free.get(claim.node, {})
        for uuid in [u for u in claim.uuids if u in node_free][:claim.gpus]:
            core, ratio = node_free[uuid]
            node_free[uuid] = (core - min(claim.core, max(core, 0)), ratio - min(claim.ratio, max(ratio, 0)))
    return free


def metric(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Samples of one metric from Prometheus text: (labels, value)."""
    out = []
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        labels: dict[str, str] = {}
        if "{" in head:
            base, _, rest = head.partition("{")
            if base != name:
                continue
            for part in rest.rstrip("}").split(","):
                if "=" in part:
                    k, _, v = part.partition("=")
                    labels[k] = v.strip('"')
        elif head != name:
            continue
        out.append((labels, float(value)))
    return out


def slope_per_min(samples: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) samples, per minute; 0 for fewer than 3."""
    if len(samples) < 3:
        return 0.0
    n = len(samples)
    mx = sum(t for t, _ in samples) / n
    my = sum(v for _, v in samples) / n
    den = sum((t - mx) ** 2 for t, _ in samples)
    return 0.0 if den == 0 else 60.0 * sum((t - mx) * (v - my) for t, v in samples) / den
