"""The seeded workload: pods created and deleted at a configured rate, shapes from the openb trace.

Shapes (GPUs, per-GPU share) are drawn from `openb_pod_list_default.csv` of the
Alibaba GPU trace (alibaba-gpu-v2023; the path is an argument, the files are
never copied into the repository), else from a small built-in table with the
trace's proportions. On top of the shape each pod gets a kind:

- plain: one container with the shape (or none for CPU-only);
- sidecar: the GPU container plus a sidecar that asked for no GPU;
- init: an init container without GPU before the GPU container;
- isoenv: the pod sets NVIDIA_VISIBLE_DEVICES=all and HAMi/MPS limits in its own env;
- forged: created with spec.nodeName and an allocation nobody signed, or one
  replayed from another pod (signature and all);
- edited: a running scheduled pod's allocation annotation raised to whole GPUs.

Every random choice comes from one `random.Random(seed)`, in step order, so a
seed and a step number name a pod exactly.
"""

from __future__ import annotations

import csv
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.soak import adapter

IMAGE = "fgpu.local/busybox:1"
NAMESPACE = "default"
KIND_LABEL = "fgpu.soak/kind"
STEP_LABEL = "fgpu.soak/step"
RUN = ["sh", "-c", "exec sleep 100000"]
ISOLATION_ENV = {
    "NVIDIA_VISIBLE_DEVICES": "all",
    "CUDA_DEVICE_MEMORY_LIMIT_0": "999999m",
    "CUDA_DEVICE_SM_LIMIT": "100",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
    "FGPU_GPU_UUIDS": "GPU-forged",
}

#: (GPUs, per-GPU milli, weight): the openb default trace's mix, coarsened
BUILTIN_SHAPES: tuple[tuple[int, int, float], ...] = (
    (0, 0, 13.4), (1, 250, 10.0), (1, 500, 12.0), (1, 300, 8.0), (1, 700, 7.8),
    (1, 1000, 48.0), (2, 1000, 0.6), (4, 1000, 0.4), (8, 1000, 0.2),
)
KINDS: tuple[tuple[str, float], ...] = (
    ("plain", 0.55), ("sidecar", 0.1), ("init", 0.1), ("isoenv", 0.1), ("forged", 0.08), ("edited", 0.07),
)


@dataclass(frozen=True)
class Shape:
    gpus: int
    milli: int  # per GPU; 1000 = whole

    @property
    def label(self) -> str:
        if self.gpus == 0:
            return "cpu"
        return f"{self.gpus}x{'whole' if self.milli >= 1000 else f'{self.milli // 10}%'}"


def load_shapes(trace_dir: str | None) -> tuple[list[Shape], list[float], str]:
    """Shapes and weights from the trace, or the built-in table; the third value says which."""
    path = os.path.join(trace_dir or "", "openb_pod_list_default.csv")
    if trace_dir and os.path.isfile(path):
        counts: dict[Shape, int] = {}
        with open(path) as f:
            for row in csv.DictReader(f):
                gpus, milli = int(row["num_gpu"]), int(row["gpu_milli"])
                # The soak's nodes have at most 8 GPUs; the trace's 8-GPU pods stay in.
                shape = Shape(gpus=min(gpus, 8), milli=milli if gpus else 0)
                counts[shape] = counts.get(shape, 0) + 1
        shapes = sorted(counts, key=lambda s: (s.gpus, s.milli))
        return shapes, [float(counts[s]) for s in shapes], path
    shapes = [Shape(g, m) for g, m, _ in BUILTIN_SHAPES]
    return shapes, [w for _, _, w in BUILTIN_SHAPES], "built-in"


def gpu_limits(shape: Shape) -> dict[str, Any]:
    if shape.gpus == 0:
        return {}
    if shape.milli >= 1000:
        return {adapter.NVIDIA_GPU: shape.gpus}
    percent = max(1, shape.milli // 10)
    return {adapter.GPU_CORE: percent, adapter.GPU_MEMORY_RATIO: percent}


def _container(name: str, limits: dict[str, Any], *, env: dict[str, str] | None = None,
               command: Sequence[str] = RUN) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "image": IMAGE, "command": list(command),
                            "resources": {"requests": {"cpu": "10m", "memory": "8Mi"}}}
    if limits:
        spec["resources"]["limits"] = dict(limits)
    if env:
        spec["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return spec


def pod_manifest(*, step: int, kind: str, shape: Shape) -> dict[str, Any]:
    limits = gpu_limits(shape)
    containers = [_container("main", limits, env=ISOLATION_ENV if kind == "isoenv" else None)]
    spec: dict[str, Any] = {"schedulerName": adapter.SCHEDULER_NAME, "containers": containers,
                            "terminationGracePeriodSeconds": 5}
    if kind == "sidecar":
        containers.append(_container("sidecar", {}, env={"NVIDIA_VISIBLE_DEVICES": "all"}))
    if kind == "init":
        spec["initContainers"] = [_container("setup", {}, command=["sh", "-c", "env"])]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"soak-{step:06d}-{kind}-{shape.label.replace('%', 'p')}", "namespace": NAMESPACE,
                     "labels": {KIND_LABEL: kind, STEP_LABEL: str(step)}},
        "spec": spec,
    }


def forged_manifest(*, step: int, node: str, uuid: str, minor: int, memory_bytes: int,
                    replay_from: dict[str, str] | None) -> dict[str, Any]:
    """A pod placed by hand on `node` with an allocation the scheduler never signed for it."""
    pod = pod_manifest(step=step, kind="forged", shape=Shape(1, 500))
    pod["spec"]["nodeName"] = node
    pod["spec"].pop("schedulerName")
    if replay_from:
        annotations = {k: v for k, v in replay_from.items() if k.startswith(("fgpu.io/", "scheduling.koordinator.sh/"))}
    else:
        annotations = {adapter.DEVICE_ALLOCATED: adapter.forged_allocation(
            uuid=uuid, minor=minor, core=100, memory_bytes=memory_bytes, container="main")}
    pod["metadata"]["annotations"] = annotations
    return pod


def pick_kind(rng: random.Random) -> str:
    kinds = [k for k, _ in KINDS]
    return rng.choices(kinds, weights=[w for _, w in KINDS])[0]


def core_request(pod: dict[str, Any]) -> int:
    """The pod's GPU core request in percent of one GPU (a whole GPU is 100), app containers summed."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        limits = (c.get("resources") or {}).get("limits") or {}
        total += 100 * int(limits.get(adapter.NVIDIA_GPU, 0) or 0) + int(limits.get(adapter.GPU_CORE, 0) or 0)
    return total
