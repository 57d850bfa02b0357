"""Benchmark of one agent usage cycle on an 8-GPU node: CPU time per cycle.

The node is examples/inventories/h100-8x-nvlink.yaml behind the fake NVML,
with P processes per GPU (default 8, so 64 processes), each with a
/proc/<pid>/cgroup file (cgroup v2, systemd driver, one pod per GPU) in a
temporary proc tree. One cycle is what the agent does every poll interval:
memory, utilization and process list per GPU, each process mapped to its pod.

Side by side in one run, on the same node:

* ``noop``: the sampler with no GPU to sample (the loop's own cost);
* ``cached``: the production path, each process's cgroup file read once;
* ``uncached``: the same cycle re-reading every /proc/<pid>/cgroup each time;
* ``poll``: the agent's whole poll iteration (`NVMLWorker.run_once`): the
  cached cycle plus health checks, Prometheus gauges and the kubelet
  checkpoint check.

CPU time is `time.process_time()` over many cycles, divided by the count.
The fake NVML's calls are Python; the real library's are ctypes calls into
libnvidia-ml, of a similar order, so the figure is a fair stand-in.

    python bench/agent.py --cycles 2000 --json

prints one JSON line per variant:
    {"variant": "cached", "gpus": 8, "processes": 64, "cpu_ms_per_cycle": .., "cycles": ..}
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.cgroups import PidResolver
from agent.checkpoint import CheckpointReader
from agent.discovery import discover
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import ProcessSpec, load_inventory
from agent.health import HealthTracker
from agent.metrics import AgentMetrics
from agent.nodestate import NodeState
from agent.nvmlworker import NVMLWorker
from agent.pcitopology import InventoryTopology
from agent.usage import SampleTarget, UsageSampler, targets_from
from apis import names

INVENTORY = Path(__file__).resolve().parents[1] / "examples" / "inventories" / "h100-8x-nvlink.yaml"
BUDGET_MS = 5.0


def _cgroup_line(gpu: int) -> str:
    uid = f"{gpu:08x}_0000_4000_8000_{gpu:012x}"
    return f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/cri-containerd-{gpu:064x}.scope\n"


def build(processes_per_gpu: int, proc_root: str) -> tuple[FakeNVML, tuple[SampleTarget, ...]]:
    inventory = load_inventory(str(INVENTORY))
    nvml = FakeNVML(inventory)
    nvml.nvmlInit()
    for gpu in range(len(inventory.gpus)):
        procs = []
        for i in range(processes_per_gpu):
            pid = 10_000 + gpu * 1000 + i
            os.makedirs(os.path.join(proc_root, str(pid)), exist_ok=True)
            with open(os.path.join(proc_root, str(pid), "cgroup"), "w") as f:
                f.write(_cgroup_line(gpu))
            procs.append(ProcessSpec(pid=pid, used_memory_bytes=2**30))
        nvml.set_usage(gpu, utilization_percent=50, memory_used_bytes=processes_per_gpu * 2**30, processes=tuple(procs))
    found = discover(nvml, node_name="bench", topology=InventoryTopology(inventory))
    return nvml, targets_from(found.handles, gpus=found.devices.gpus)


def measure(sampler: UsageSampler, targets: tuple[SampleTarget, ...], cycles: int) -> float:
    sampler.sample(targets)  # warm: the first cycle fills the cache in the cached variant
    started = time.process_time()
    for _ in range(cycles):
        sampler.sample(targets)
    return (time.process_time() - started) * 1000.0 / cycles


def measure_poll(nvml: FakeNVML, proc_root: str, cycles: int) -> float:
    metrics = AgentMetrics()
    state = NodeState(node_name="bench", health=HealthTracker(), metrics=metrics)
    worker = NVMLWorker(
        nvml,
        state=state,
        topology=InventoryTopology(load_inventory(str(INVENTORY))),
        resolver=PidResolver(proc_root=proc_root),
        checkpoint=CheckpointReader(os.path.join(proc_root, "no-checkpoint")),
        external_resources=(names.NVIDIA_GPU,),
        metrics=metrics,
        discovery_interval_s=1e9,  # discovery happens once a minute, not per poll
        watch_xids=False,
    )
    worker.run_once()  # discovery, and the first cycle fills the cgroup cache
    started = time.process_time()
    for _ in range(cycles):
        worker.run_once()
    return (time.process_time() - started) * 1000.0 / cycles


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--processes-per-gpu", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="one JSON line per variant")
    args = parser.parse_args()
    proc_root = tempfile.mkdtemp(prefix="fgpu-bench-proc-")
    try:
        nvml, targets = build(args.processes_per_gpu, proc_root)
        variants = {
            "noop": (UsageSampler(nvml, resolver=PidResolver(proc_root=proc_root)), ()),
            "cached": (UsageSampler(nvml, resolver=PidResolver(proc_root=proc_root)), targets),
            "uncached": (UsageSampler(nvml, resolver=PidResolver(proc_root=proc_root, cached=False)), targets),
        }
        results = []
        for name, (sampler, variant_targets) in variants.items():
            per_cycle = measure(sampler, variant_targets, args.cycles)
            results.append(
                {
                    "variant": name,
                    "gpus": len(variant_targets),
                    "processes": len(variant_targets) * args.processes_per_gpu,
                    "cpu_ms_per_cycle": round(per_cycle, 4),
                    "cycles": args.cycles,
                }
            )
        results.append(
            {
                "variant": "poll",
                "gpus": len(targets),
                "processes": len(targets) * args.processes_per_gpu,
                "cpu_ms_per_cycle": round(measure_poll(nvml, proc_root, args.cycles), 4),
                "cycles": args.cycles,
            }
        )
    finally:
        shutil.rmtree(proc_root, ignore_errors=True)
    if args.json:
        for r in results:
            print(json.dumps(r))
    else:
        print(f"{'variant':<10} {'gpus':>4} {'procs':>5} {'cpu ms/cycle':>13}")
        for r in results:
            print(f"{r['variant']:<10} {r['gpus']:>4} {r['processes']:>5} {r['cpu_ms_per_cycle']:>13.4f}")
        poll = next(r for r in results if r["variant"] == "poll")["cpu_ms_per_cycle"]
        verdict = "within" if float(poll) < BUDGET_MS else "OVER"
        print(f"whole poll iteration: {poll:.3f} ms CPU, {verdict} the {BUDGET_MS:g} ms budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
