"""Micro-benchmark of the scheduler core: one pod's decision at 100 / 1,000 / 10,000 nodes.

Each size builds N nodes of 8 x A100-80GB, fills them to about half their GPU
capacity with a trace-like mix (shares of 10..50% of a card, whole 1/2/4-GPU
pods), then times, per pod and side by side in one run:

* ``select``: filter + score + tie-break over all nodes, then reserve
  (what the standalone loop and the trace replay do);
* ``extender``: ``filter()`` with a verdict per node, ``score()`` of the
  feasible ones, then reserve (what the kube-scheduler extender does).

Each decided pod is unreserved again so the fill stays at ~50% throughout.

    python bench/scheduler_core.py --nodes 100,1000,10000 --pods 400 --json [--clock cpu]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable

from apis.devices import GPUInfo, NodeDevices
from apis.request import DeviceRequest
from scheduler_plugin.core.api import NodeInfo, NodeName, PodRequest, PodUID, SchedulingError
from scheduler_plugin.core.policies import policy_names
from scheduler_plugin.core.scheduler import Scheduler

GiB = 2**30
#: wall: elapsed time; cpu: this process's CPU time, steadier on a machine shared with other work
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
GPUS_PER_NODE = 8
GPU_MEMORY = 80 * GiB
#: the policy timed unless --policy says otherwise: the figures in docs/scheduler.md are binpack's
BENCH_POLICY = "binpack"


def _node(name: str) -> NodeDevices:
    gpus = tuple(
        GPUInfo(
            uuid=f"GPU-{name}-{i}",
            minor=i,
            index=i,
            model="NVIDIA A100-SXM4-80GB",
            model_label="A100-SXM4-80GB",
            memory_bytes=GPU_MEMORY,
        )
        for i in range(GPUS_PER_NODE)
    )
    return NodeDevices(node_name=name, gpus=gpus)


def _request(rng: random.Random) -> DeviceRequest:
    """A trace-like request: mostly shares, some whole GPUs."""
    roll = rng.random()
    if roll < 0.6:
        core = rng.choice([10, 20, 25, 30, 50])
        return DeviceRequest(1, core, None, core, False, "bench")
    cards = rng.choices([1, 2, 4], weights=[6, 3, 1])[0]
    return DeviceRequest(cards, 100, None, 100, True, "bench")


def _pod(serial: int, rng: random.Random) -> PodRequest:
    return PodRequest(
        uid=PodUID(f"pod-{serial}"),
        namespace="bench",
        name=f"pod-{serial}",
        device=_request(rng),
        cpu_milli=rng.choice([1000, 2000, 4000]),
        memory_bytes=rng.choice([4, 8, 16]) * GiB,
    )


def build(nodes: int, *, seed: int, policy: str) -> tuple[Scheduler, random.Random]:
    rng = random.Random(seed)
    scheduler = Scheduler(policy=policy)
    for i in range(nodes):
        name = f"node-{i:05d}"
        scheduler.upsert_node_devices(_node(name))
        scheduler.upsert_node_info(NodeInfo(name=NodeName(name), cpu_milli=128_000, memory_bytes=1024 * GiB))
    # Fill to ~50% of GPU capacity, placing each pod on a random node where it fits.
    target = nodes * GPUS_PER_NODE * 100 // 2
    placed, serial, names = 0, 0, [NodeName(f"node-{i:05d}") for i in range(nodes)]
    while placed < target:
        serial += 1
        pod = _pod(serial, rng)
        node = rng.choice(names)
        try:
            allocation = scheduler.reserve(pod, node)
        except SchedulingError:  # that node is full; try another pod
            continue
        scheduler.confirm(pod.uid)
        placed += sum(share.core_percent for share in allocation.gpus)
    return scheduler, rng


def _time(
    pods: list[PodRequest],
    decide: Callable[[PodRequest], object],
    scheduler: Scheduler,
    clock: Callable[[], float],
) -> list[float]:
    samples = []
    for pod in pods:
        start = clock()
        decide(pod)
        samples.append((clock() - start) * 1000.0)
        scheduler.unreserve(pod.uid)
    return samples


def measure(nodes: int, *, pods: int, seed: int, policy: str, clock: str = "wall") -> dict[str, object]:
    scheduler, rng = build(nodes, seed=seed, policy=policy)
    batch = [_pod(10_000_000 + i, rng) for i in range(pods)]

    def select(pod: PodRequest) -> object:
        node = scheduler.select(pod)
        return None if node is None else scheduler.reserve(pod, node)

    def extender(pod: PodRequest) -> object:
        feasible = [v.node_name for v in scheduler.filter(pod) if v.feasible]
        if not feasible:
            return None
        best = max(scheduler.score(pod, feasible), key=lambda item: item[1])[0]
        return scheduler.reserve(pod, best)

    timer = CLOCKS[clock]
    _time(batch[:20], select, scheduler, timer)  # warm caches (tie-break order, label columns)
    result: dict[str, object] = {
        "nodes": nodes,
        "gpus": nodes * GPUS_PER_NODE,
        "policy": policy,
        "clock": clock,
    }
    for label, decide in (("select", select), ("extender", extender)):
        samples = sorted(_time(batch, decide, scheduler, timer))
        result[label] = {
            "p50_ms": round(statistics.median(samples), 3),
            "p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 3),
            "pods_per_s": round(1000.0 * len(samples) / sum(samples), 1),
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", default="100,1000,10000", help="comma-separated node counts")
    parser.add_argument("--pods", type=int, default=400, help="pods timed per size")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policy", default=BENCH_POLICY, choices=policy_names())
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="what a sample measures")
    parser.add_argument("--json", action="store_true", help="one JSON object per size")
    args = parser.parse_args(argv)
    for text in args.nodes.split(","):
        result = measure(int(text), pods=args.pods, seed=args.seed, policy=args.policy, clock=args.clock)
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print(
                f"{result['nodes']:>6} nodes  select {result['select']}  extender {result['extender']}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
