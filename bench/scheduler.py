"""Benchmark of one pod's decision through the scheduler service: filter + score + reserve.

Builds N nodes from a realistic mix (the trace's node list when --trace is
given, cloned as needed to reach N; otherwise 8-GPU and 2-GPU nodes), fills
them to about 50% of their GPU capacity with trace-like pods, then times per
pod `SchedulingService.place` (parse the pod manifest, filter + score +
tie-break over every node, reserve on the best) and releases the reservation
again (untimed), so the fill stays put.

Side by side in the same run, on the same pods, the core alone
(`Scheduler.select` + `reserve` on an already parsed request), so what the
service adds (manifest parsing, locking, metrics) is visible.

    python bench/scheduler.py --nodes 1000 --json
    python bench/scheduler.py --nodes 100,1000,10000 --json --trace /work/shared/traces/alibaba-gpu-v2023
    python bench/scheduler.py --nodes 100,1000,10000 --clock cpu   # on a busy shared machine

Each size prints one JSON line:
    {"nodes": N, "p50_ms": .., "p99_ms": .., "pods_per_s": .., "core_p50_ms": .., "core_p99_ms": .., "core_pods_per_s": ..}
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from apis import names
from apis.devices import GPUInfo, NodeDevices
from apis.signing import SigningKey
from scheduler_plugin.backend_embedded import EmbeddedBackend
from scheduler_plugin.core.api import NodeName, PodRequest, PodUID
from scheduler_plugin.core.policies import policy_names
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.scheduling import SchedulingService

GiB = 1024**3
#: the policy timed unless --policy says otherwise: the figures in docs/scheduler.md are binpack's
BENCH_POLICY = "binpack"
#: Per-GPU memory by trace model label (the trace gives models, not sizes).
MODEL_MEMORY_GIB = {"P100": 16, "T4": 16, "V100M16": 16, "V100M32": 32, "A10": 24, "G2": 32, "G3": 32}

Shape = tuple[int, int, int, int, tuple[str, ...]]  # cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec


def synthetic_nodes(n: int) -> list[tuple[str, int, str]]:
    """(name, gpus, model): three quarters 8-GPU A100 nodes, a quarter 2-GPU T4 nodes."""
    return [(f"node-{i:05d}", 2, "T4") if i % 4 == 3 else (f"node-{i:05d}", 8, "A100-SXM4-80GB") for i in range(n)]


def trace_nodes(trace: str, n: int) -> list[tuple[str, int, str]]:
    from scheduler_plugin.sim.trace import read_nodes

    base = [t for t in read_nodes(os.path.join(trace, "openb_node_list_gpu_node.csv")) if t.gpus]
    return [(f"{base[i % len(base)].name}-{i // len(base)}", base[i % len(base)].gpus, base[i % len(base)].model) for i in range(n)]


def synthetic_shapes(rng: random.Random, count: int) -> list[Shape]:
    shapes: list[Shape] = []
    for _ in range(count):
        if rng.random() < 0.6:
            shapes.append((4000, 16384, 1, rng.choice([100, 200, 250, 300, 500]), ()))
        else:
            shapes.append((8000, 32768, rng.choices([1, 2, 4], weights=[6, 3, 1])[0], 1000, ()))
    return shapes


def trace_shapes(trace: str, rng: random.Random, count: int) -> list[Shape]:
    from scheduler_plugin.sim.trace import read_pods

    pods = [p for p in read_pods(os.path.join(trace, "openb_pod_list_default.csv")) if p.num_gpu]
    return [(p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.gpu_spec) for p in (rng.choice(pods) for _ in range(count))]


def devices(name: str, gpus: int, model: str) -> NodeDevices:
    memory = MODEL_MEMORY_GIB.get(model, 80 if "80GB" in model else 32) * GiB
    return NodeDevices(
        node_name=name,
        gpus=tuple(GPUInfo(uuid=f"GPU-{name}-{i}", minor=i, index=i, model=model, model_label=model, memory_bytes=memory) for i in range(gpus)),
    )


def manifest(name: str, shape: Shape) -> dict[str, Any]:
    cpu, mem_mib, num_gpu, milli, spec = shape
    requests: dict[str, str] = {"cpu": f"{cpu}m", "memory": f"{mem_mib}Mi"}
    if num_gpu and milli == 1000:
        requests[names.NVIDIA_GPU] = str(num_gpu)
    elif num_gpu:
        requests[names.GPU_CORE] = str(milli // 10)
        requests[names.GPU_MEMORY_RATIO] = str(milli // 10)
    annotations = {names.GPU_MODEL_USE: ",".join(spec)} if spec else {}
    return {
        "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "resources": {"requests": requests, "limits": {k: v for k, v in requests.items() if "/" in k}}}]},
    }


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


#: Wall time by default; `--clock cpu` counts only this thread's CPU time, which
#: keeps the figures meaningful on a machine shared with other busy processes.
CLOCK: Callable[[], float] = time.perf_counter


def timed(op: Callable[[], object]) -> float:
    start = CLOCK()
    op()
    return (CLOCK() - start) * 1000


def run(size: int, *, trace: str | None, pods: int, seed: int, policy: str) -> dict[str, Any]:
    rng = random.Random(seed)
    layout = trace_nodes(trace, size) if trace else synthetic_nodes(size)
    with tempfile.TemporaryDirectory() as tmp:
        backend = EmbeddedBackend(path=os.path.join(tmp, "bench.db"))
        core = Scheduler(policy=policy, tie_break_seed=seed)
        service = SchedulingService(core_factory=lambda: core, backend=backend, signing_key=SigningKey.generate())
        backend.start(service)
        for name, gpus, model in layout:
            service.on_devices(devices(name, gpus, model))  # the feed path: no SQLite write per node
        capacity = sum(g for _, g, _ in layout) * 100

        def make_shapes(k: int) -> list[Shape]:
            return trace_shapes(trace, rng, k) if trace else synthetic_shapes(rng, k)

        # Fill to ~50% through the core directly: the fill is setup, not what is measured.
        used, filled, misses = 0, 0, 0
        while used < capacity // 2 and misses < 200:
            for shape in make_shapes(256):
                request = service.request(manifest(f"fill-{filled}", shape))
                node = core.select(request)
                if node is None:
                    misses += 1
                    continue
                core.add_pod(request, node, core.reserve(request, node))
                used += shape[2] * shape[3] // 10
                filled += 1
                if used >= capacity // 2:
                    break

        shapes = make_shapes(pods)
        manifests = [manifest(f"m-{i}", s) for i, s in enumerate(shapes)]
        requests: list[PodRequest] = [service.request(m) for m in manifests]
        for m in manifests[:20]:  # warm up caches and code paths
            service.place(m)
            core.unreserve(PodUID(str(m["metadata"]["uid"])))

        service_ms: list[float] = []
        core_ms: list[float] = []
        for m, request in zip(manifests, requests, strict=True):
            uid = request.uid
            def via_service(m: dict[str, Any] = m) -> None:
                service.place(m)

            service_ms.append(timed(via_service))
            core.unreserve(uid)

            def core_only(request: PodRequest = request) -> None:
                node: NodeName | None = core.select(request)
                if node is not None:
                    core.reserve(request, node)

            core_ms.append(timed(core_only))
            core.unreserve(uid)
        backend.stop()
    return {
        "policy": policy,
        "nodes": size,
        "p50_ms": round(statistics.median(service_ms), 3),
        "p99_ms": round(percentile(service_ms, 99), 3),
        "pods_per_s": round(len(service_ms) / (sum(service_ms) / 1000), 1),
        "core_p50_ms": round(statistics.median(core_ms), 3),
        "core_p99_ms": round(percentile(core_ms, 99), 3),
        "core_pods_per_s": round(len(core_ms) / (sum(core_ms) / 1000), 1),
        "fill_pods": filled,
        "fill_percent": round(100 * used / capacity, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="1000", help="node count, or a comma-separated list, e.g. 100,1000,10000")
    p.add_argument("--pods", type=int, default=500, help="pods timed per size")
    p.add_argument("--trace", help="trace directory (openb_node_list_gpu_node.csv, openb_pod_list_default.csv)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--policy",
        action="append",
        choices=policy_names(),
        help=f"scheduling policy, repeatable to compare (default {BENCH_POLICY})",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per size")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="wall time, or this thread's CPU time")
    args = p.parse_args(argv)
    global CLOCK
    CLOCK = time.thread_time if args.clock == "cpu" else time.perf_counter
    sizes = [int(s) for s in str(args.nodes).split(",") if s]
    policies = args.policy or [BENCH_POLICY]
    results = [
        run(n, trace=args.trace, pods=args.pods, seed=args.seed, policy=policy) for policy in policies for n in sizes
    ]
    for r in results:
        if args.json:
            print(json.dumps(r))
        else:
            print(
                f"{r['policy']:>8} {r['nodes']:>6} nodes  service p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms  {r['pods_per_s']:.0f} pods/s"
                f"  |  core p50 {r['core_p50_ms']:.3f} ms  p99 {r['core_p99_ms']:.3f} ms  (fill {r['fill_percent']}%)"
            )
    if len(sizes) > 1 and len(policies) == 1 and not args.json:
        first, last = results[0], results[-1]
        growth = last["p50_ms"] / first["p50_ms"] if first["p50_ms"] else float("nan")
        print(f"p50 grows {growth:.1f}x from {first['nodes']} to {last['nodes']} nodes ({last['nodes'] / first['nodes']:.0f}x the nodes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
