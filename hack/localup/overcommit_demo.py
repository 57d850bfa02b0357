"""`hack/local-up.sh --overcommit-demo`: a burstable GPU share admitted beyond what the guaranteed shares
leave free, then evicted by the node agent when scripted memory growth pushes the GPU past its high-water
mark (docs/overcommit.md).

The default demo's scheduler keeps its state in SQLite, with no Node objects to carry the
`fgpu.io/burstable-ratio` label and no API through which reclaim could delete a pod. This one runs the
soak's Kubernetes-mode stack (bench/soak/stack.py) at its smallest: the API double, one fgpu-scheduler
(standalone, state in the API), one fgpu-agent in Kubernetes mode (hami-core, a fake one-GPU H100, an
overcommit settings file with ratio 2), its fgpu-runtime-proxy in front of a real containerd, and the
soak's kubelet-like driver (bench/soak/kubelet.py) creating the pods the API binds to the node, each in
its own pod cgroup as kubelet makes it.

Nothing here calls the scheduler or the agent directly: pods are created in the API, the scheduler binds
them, the driver runs them, and GPU memory use is scripted through the fake NVML's usage file
(`agent.fakenvml.USAGE_FILE_ENV`), naming each pod's real container process (its host pid, from
containerd), which the agent maps to its pod through /proc/<pid>/cgroup as on a node.
"""

from __future__ import annotations

import contextlib
import glob
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from agent.fakenvml_usage import USAGE_FILE_ENV
from apis import names
from apis.allocation import AllocationError, decode_allocation
from bench.soak.kubeclient import NODES, PODS, ApiError, Client
from bench.soak.kubelet import NodeDriver
from bench.soak.stack import Node, SoakStack
from hack.localup.overcommit_report import DemoPod, Outcome
from hack.localup.report import human_bytes
from hack.localup.stack import StackError, teardown

RATIO = "2"
HIGH_WATER = 0.95
#: the node pool's overcommit settings (agent/reclaim_settings.py), shortened so the demo is quick
SETTINGS = {"ratio": float(RATIO), "highWater": HIGH_WATER, "pressureGrace": "1s", "cooldown": "30s",
            "evictionGrace": "2s", "retry": "10s", "interval": "250ms", "dryRun": False}
NAMESPACE = "demo"
IMAGE = "fgpu.local/busybox:1"
GUARANTEED, BURSTABLE = "serving-guaranteed", "batch-burstable"
#: (core %, memory % of the card) requested, then the burstable limit; the guaranteed pod takes 70%
#: of the card, so 30% is left for guaranteed shares and ratio 2 lets burstable limits reach 60%.
REQUESTS = {GUARANTEED: (70, 70), BURSTABLE: (20, 20)}
BURST_LIMIT = (50, 50)
#: each pod's GPU memory in use, in % of the card: steady (85% in all), then the burstable pod grows
#: inside its own limit until the card is past the high-water mark (96%)
STEADY = {GUARANTEED: 60, BURSTABLE: 25}
PRESSURE = {GUARANTEED: 60, BURSTABLE: 36}
#: how long the steady phase is watched for an eviction that must not happen
STEADY_S = 3.0


class DemoError(RuntimeError):
    """A step of the demo did not happen in time; the message says which."""


def _wait(what: str, condition: Callable[[], Any], *, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(ApiError):
            value = condition()
            if value:
                return value
        if time.monotonic() > deadline:
            raise DemoError(f"no {what} after {timeout_s:.0f}s")
        time.sleep(0.1)


def write_inventory(repo: str, path: str) -> None:
    """One H100 of the example node, without its NVLinks: one card makes the arithmetic plain."""
    with open(os.path.join(repo, "examples", "inventories", "h100-8x-nvlink.yaml")) as f:
        data = yaml.safe_load(f)
    gpu = dict(data["gpus"][0])
    gpu.pop("nvlinks", None)
    data["gpus"] = [gpu]
    with open(path, "w") as f:
        yaml.safe_dump(data, f, sort_keys=False)


def pod_manifest(name: str) -> dict[str, Any]:
    core, ratio = REQUESTS[name]
    annotations = {}
    if name == BURSTABLE:
        annotations = {names.GPU_QOS: names.GPU_QOS_BURSTABLE, names.GPU_CORE_LIMIT: str(BURST_LIMIT[0]),
                       names.GPU_MEMORY_RATIO_LIMIT: str(BURST_LIMIT[1])}
    limits = {names.GPU_CORE: str(core), names.GPU_MEMORY_RATIO: str(ratio)}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations},
        "spec": {
            "schedulerName": names.SCHEDULER_NAME, "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": IMAGE, "command": ["sh", "-c", "exec sleep 100000"],
                            "resources": {"limits": limits, "requests": limits}}],
        },
    }


class Demo:
    def __init__(self, *, workdir: str, repo: str, out: Callable[[str], None]) -> None:
        self.workdir = workdir
        self.out = out
        self.usage_file = os.path.join(workdir, "gpu-usage.yaml")
        self.settings_file = os.path.join(workdir, "overcommit.yaml")
        inventory = os.path.join(workdir, "inventory-1gpu.yaml")
        os.makedirs(workdir, exist_ok=True)
        write_inventory(repo, inventory)
        with open(self.settings_file, "w") as f:
            yaml.safe_dump(SETTINGS, f, sort_keys=False)
        self.stack = SoakStack(
            root=workdir, repo=repo, nodes=1, lease_s=3.0, isolation=names.ISOLATION_HAMI_CORE,
            inventories=(inventory,), schedulers=1, overcommit=self.settings_file,
            agent_env={USAGE_FILE_ENV: self.usage_file},
        )
        self.driver: NodeDriver | None = None
        self.uids: list[str] = []

    @property
    def node(self) -> Node:
        return self.stack.nodes[0]

    def start(self) -> None:
        self.stack.start()
        self.driver = NodeDriver(self.node, self.stack.api.url, on_running=lambda _uid, _t: None, pod_cgroups=True)
        self.driver.start()

    def stop(self, *, keep_logs: bool) -> None:
        drained = self.driver is None or self._drain(self.driver)
        if self.driver is not None:
            self.driver.stop()
        if not drained:
            # The stack's stop takes containerd and its shims down before its teardown, which finds the
            # containers by their shims: a pod still running would outlive it. Slower (its daemons are our
            # children, and it waits out their grace), so only when the drain did not do it.
            teardown(self.workdir, remove=False)
        self.stack.stop(keep=keep_logs)
        remove_pod_cgroups(self.uids)

    def _drain(self, driver: NodeDriver) -> bool:
        """Deletes the demo's pods, as the soak drains its own; the driver stops and removes them as
        kubelet would. True once none runs."""
        client = Client(self.stack.api.url)
        with contextlib.suppress(ApiError):
            for pod in client.list(PODS.format(ns=NAMESPACE)):
                client.delete(f"{PODS.format(ns=NAMESPACE)}/{pod['metadata']['name']}", grace_s=1)
        try:
            _wait("the demo's pods removed", lambda: driver.sandboxes() == 0, timeout_s=20)
        except DemoError:
            return False
        return True

    # --- the scenario -------------------------------------------------------------------------
    def run(self) -> Outcome:
        client = Client(self.stack.api.url)
        node, gpu = self.node, self.node.gpus[0]
        label = _wait(f"{names.NODE_BURSTABLE_RATIO} label on {node.name}",
                      lambda: ((client.get(f"{NODES}/{node.name}") or {}).get("metadata") or {})
                      .get("labels", {}).get(names.NODE_BURSTABLE_RATIO), timeout_s=30)
        self.out(f"==> {node.name}: {names.NODE_BURSTABLE_RATIO}={label} (fgpu-agent, from {self.settings_file})")
        pods: dict[str, DemoPod] = {}
        for name in (GUARANTEED, BURSTABLE):
            created = client.create(PODS.format(ns=NAMESPACE), pod_manifest(name))
            self.uids.append(created["metadata"]["uid"])
            pods[name] = self._running(client, name)
            p = pods[name]
            self.out(f"==> {name} ({p.tier}): bound, running; its container's memory cap is its "
                     f"{'limit' if p.tier == 'burstable' else 'request'}")
        pids = self._pids()
        steady = self._use(STEADY, pids, gpu.memory_bytes)
        self.out(f"==> steady use {human_bytes(steady)} of {human_bytes(gpu.memory_bytes)}; watching {STEADY_S:.0f}s")
        time.sleep(STEADY_S)
        problems = [f"{n} deleted in the steady phase" for n in pods if self._deleting(client, n)]
        pressure = self._use(PRESSURE, pids, gpu.memory_bytes)
        began = time.monotonic()
        self.out(f"==> scripted growth of {BURSTABLE}: {human_bytes(pressure)} in use, past highWater {HIGH_WATER:.0%}")
        _wait(f"deletion of {BURSTABLE} by fgpu-agent", lambda: self._deleting(client, BURSTABLE), timeout_s=40)
        evicted_after = time.monotonic() - began
        _wait(f"{BURSTABLE} gone (the driver stops it and confirms)",
              lambda: client.get(f"{PODS.format(ns=NAMESPACE)}/{BURSTABLE}") is None, timeout_s=30)
        # Its process is gone with its container: NVML no longer lists it.
        after = self._use({GUARANTEED: PRESSURE[GUARANTEED]}, pids, gpu.memory_bytes)
        self.out(f"==> {BURSTABLE} deleted by fgpu-agent {evicted_after:.1f}s after the pressure began; "
                 f"{human_bytes(after)} in use now")
        events = _wait("Event BurstableEvicted", lambda: [
            (e["involvedObject"]["name"], str(e.get("message", "")))
            for e in client.list(f"/api/v1/namespaces/{NAMESPACE}/events")
            if e.get("reason") == names.EVENT_BURSTABLE_EVICTED], timeout_s=10)
        metric = _wait("the eviction metric", lambda: self._metric_evicted(), timeout_s=10)
        guaranteed_pod = client.get(f"{PODS.format(ns=NAMESPACE)}/{GUARANTEED}")
        guaranteed_runs = guaranteed_pod is not None and not guaranteed_pod["metadata"].get("deletionTimestamp") \
            and pids[GUARANTEED] in self._tasks().values()
        if not guaranteed_runs:
            problems.append(f"{GUARANTEED} is not running at the end")
        problems += [f"Event BurstableEvicted on {n}" for n, _ in events if n != BURSTABLE]
        ends = {GUARANTEED: "Running" if guaranteed_runs else "gone", BURSTABLE: "Evicted"}
        final = tuple(
            replace(p, used_steady_bytes=gpu.memory_bytes * STEADY[n] // 100,
                    used_pressure_bytes=gpu.memory_bytes * PRESSURE[n] // 100, end=ends[n],
                    evicted_after_s=evicted_after if n == BURSTABLE else None)
            for n, p in pods.items()
        )
        return Outcome(ratio=str(label), high_water=HIGH_WATER, gpu_uuid=gpu.uuid, gpu_bytes=gpu.memory_bytes,
                       pods=final, steady_used_bytes=steady, pressure_used_bytes=pressure, after_used_bytes=after,
                       events=tuple(events), metric_evicted=float(metric), problems=tuple(problems))

    def _running(self, client: Client, name: str) -> DemoPod:
        """The pod once bound and its app container runs with its environment read; what it was given."""
        driver = self.driver
        assert driver is not None
        pod = _wait(f"binding of {name}", lambda: _bound(client, name), timeout_s=30)
        seen = _wait(f"{name}'s container running", lambda: next(
            (c for c in driver.running_containers() if c.pod["metadata"]["name"] == name), None), timeout_s=40)
        share = decode_allocation(pod["metadata"]["annotations"][names.DEVICE_ALLOCATED]).gpus[0]
        limit = share.limit
        return DemoPod(
            name=name, uid=str(pod["metadata"]["uid"]), tier=names.GPU_QOS_BURSTABLE if limit is not None else names.GPU_QOS_GUARANTEED,
            request_core=share.core_percent, request_bytes=share.memory_bytes,
            limit_core=limit.core_percent if limit else 0, limit_bytes=limit.memory_bytes if limit else 0,
            gpu=share.uuid, env=dict(seen.env),
        )

    def _tasks(self) -> dict[str, int]:
        """containerd's running tasks: container ID -> host pid (`ctr tasks ls`)."""
        listing = subprocess.run(
            ["ctr", "--address", self.stack.containerd.socket_path, "-n", "k8s.io", "tasks", "ls"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout.splitlines()[1:]
        return {cells[0]: int(cells[1]) for cells in (line.split() for line in listing)
                if len(cells) >= 3 and cells[2] == "RUNNING"}

    def _pids(self) -> dict[str, int]:
        """Each demo pod's app container's host pid: the process NVML lists on the GPU."""
        assert self.driver is not None
        tasks = self._tasks()
        pids = {}
        for tracked in self.driver.pods().values():
            outcome = tracked.run.outcomes.get("main") if tracked.run is not None else None
            if outcome is not None and outcome.container_id in tasks:
                pids[str(tracked.pod["metadata"]["name"])] = tasks[outcome.container_id]
        if set(pids) != set(REQUESTS):
            raise DemoError(f"containerd runs no task for some demo pods: found {sorted(pids)}")
        return pids

    def _use(self, percent: dict[str, int], pids: dict[str, int], size: int) -> int:
        """Writes the fake NVML's usage file: each pod's process using `percent` of the card. The total."""
        processes = [{"pid": pids[n], "usedMemory": size * p // 100} for n, p in percent.items()]
        total = sum(int(p["usedMemory"]) for p in processes)
        tmp = self.usage_file + ".tmp"
        with open(tmp, "w") as f:
            yaml.safe_dump([{"gpu": 0, "memoryUsed": total, "processes": processes}], f)
        os.replace(tmp, self.usage_file)
        return total

    @staticmethod
    def _deleting(client: Client, name: str) -> bool:
        pod = client.get(f"{PODS.format(ns=NAMESPACE)}/{name}")
        return pod is None or bool(pod["metadata"].get("deletionTimestamp"))

    def _metric_evicted(self) -> float:
        text = self.stack.metrics_text(self.node.agent_metrics)
        name = names.METRIC_RECLAIM_EVICTIONS.removesuffix("_total")
        return sum(s.value for family in text_string_to_metric_families(text) if family.name == name
                   for s in family.samples if s.name.endswith("_total") and s.labels.get("result") == "evicted")


def _bound(client: Client, name: str) -> dict[str, Any] | None:
    pod = client.get(f"{PODS.format(ns=NAMESPACE)}/{name}")
    if pod is None or not pod["spec"].get("nodeName"):
        return None
    try:
        decode_allocation(pod["metadata"].get("annotations", {}).get(names.DEVICE_ALLOCATED, ""))
    except AllocationError:
        return None
    return pod


def remove_pod_cgroups(uids: list[str]) -> None:
    """The pod cgroups the runtime made under `cri.pod_cgroup` (kubelet removes a pod's; no kubelet here)."""
    for uid in uids:
        # cgroup v1: one tree per controller; v2: the one tree.
        pod_dirs = glob.glob(f"/sys/fs/cgroup/*/kubepods/burstable/pod{uid}") + glob.glob(
            f"/sys/fs/cgroup/kubepods/burstable/pod{uid}")
        for pod_dir in pod_dirs:
            for d in [*glob.glob(os.path.join(pod_dir, "*", "")), pod_dir]:
                with contextlib.suppress(OSError):
                    os.rmdir(d)


def run(*, workdir: str, repo: str, out: Callable[[str], None]) -> tuple[Outcome | None, bool]:
    """Runs the demo under `workdir` (anything an earlier run left there is stopped first). Returns the
    outcome (None when the stack did not get that far) and whether the logs were kept."""
    teardown(workdir)
    started = time.monotonic()
    demo = Demo(workdir=workdir, repo=repo, out=out)
    keep_logs = True
    try:
        out("==> starting the API double, fgpu-scheduler, fgpu-agent (Kubernetes mode, hami-core, overcommit "
            f"ratio {RATIO}), fgpu-runtime-proxy, containerd")
        demo.start()
        out(f"==> stack up in {time.monotonic() - started:.1f}s")
        outcome = demo.run()
        keep_logs = bool(outcome.problems)
        return outcome, keep_logs
    except (DemoError, StackError, ApiError, RuntimeError, subprocess.SubprocessError) as exc:
        out(f"overcommit demo: {exc}")
        return None, True
    finally:
        demo.stop(keep_logs=keep_logs)
        if keep_logs:
            out(f"logs kept in {os.path.join(workdir, 'logs')}/ (the next run clears them)")
