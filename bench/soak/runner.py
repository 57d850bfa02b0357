"""One soak run: start the stack, churn pods under faults, check the invariants, drain, report.

Phases: `churn` (pods created and deleted, faults injected, invariants checked
every second), `recover` (faults undone and stopped, no new pods: every pod that
fits must end up bound and running; the time it takes is measured), `drain`
(every pod deleted: then nothing may be left behind).

Every violation carries the seed and the step (the workload's pod counter) at
which it was seen, so `--seed S` replays the same schedule of pods and faults.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.soak import adapter, invariants, report, workload
from bench.soak.faults import Injector
from bench.soak.kubeclient import ALL_PODS, PODS, ApiError, Client
from bench.soak.kubelet import NodeDriver
from bench.soak.stack import SoakStack


@dataclass(frozen=True)
class Options:
    seconds: float
    seed: int
    nodes: int = 3
    rate_per_s: float = 0.6
    lifetime_s: float = 25.0
    fault_every_s: float = 6.0
    lease_s: float = 3.0
    trace_dir: str | None = None
    root: str = ""
    repo: str = ""
    keep: bool = False
    recover_timeout_s: float = 90.0
    isolation: str = "hami-core"


@dataclass
class PodRecord:
    step: int
    kind: str
    name: str
    uid: str
    created_at: float
    delete_at: float
    running_at: float = 0.0
    faulty: bool = False  # created within a fault's window


@dataclass
class State:
    step: int = 0
    pods: dict[str, PodRecord] = field(default_factory=dict)  # uid -> record
    violations: list[dict[str, Any]] = field(default_factory=list)
    seen_violation_keys: set[tuple[Any, ...]] = field(default_factory=set)
    checks: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    fault_log: list[dict[str, Any]] = field(default_factory=list)
    created: int = 0
    deleted: int = 0
    forged: int = 0
    edited: int = 0
    samples: dict[str, list[tuple[float, float, float, int]]] = field(default_factory=lambda: defaultdict(list))


class Soak:
    def __init__(self, options: Options, *, log: Callable[[str], None] = lambda _: None) -> None:
        self.o = options
        self.log = log
        self.rng = random.Random(options.seed)
        self.state = State()
        self.stack = SoakStack(root=options.root, repo=options.repo, nodes=options.nodes, lease_s=options.lease_s,
                               isolation=options.isolation)
        self.shapes, self.weights, self.shape_source = workload.load_shapes(options.trace_dir)
        self.drivers: list[NodeDriver] = []
        self.client: Client | None = None
        self.injector: Injector | None = None
        self._timers: list[tuple[float, int, str, Callable[[], None]]] = []
        self._timer_seq = 0
        self._fault_until = 0.0
        self._verified: dict[tuple[str, str, str], tuple[adapter.Share, ...] | None] = {}
        self._lock = threading.Lock()
        self.t0 = 0.0
        self._undos: list[tuple[threading.Timer, Callable[[], None]]] = []

    # --- plumbing -------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self.t0

    def violation(self, v: dict[str, Any]) -> None:
        key = (v.get("invariant"), v.get("uid"), v.get("container"), v.get("gpu"), v.get("node"))
        if key in self.state.seen_violation_keys:
            return
        self.state.seen_violation_keys.add(key)
        v = {"seed": self.o.seed, "step": self.state.step, "t_s": round(self.now(), 1), **v,
             "recent_faults": self.state.fault_log[-3:]}
        self.state.violations.append(v)
        self.log(f"VIOLATION {json.dumps(v, default=str)[:600]}")

    def later(self, delay_s: float, what: str, action: Callable[[], None]) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (self.now() + delay_s, self._timer_seq, what, action))

    def run_timers(self, *, all_now: bool = False) -> None:
        while self._timers and (all_now or self._timers[0][0] <= self.now()):
            _, _, what, action = heapq.heappop(self._timers)
            try:
                action()
            except Exception as exc:  # a restart that failed is retried by the next recovery step
                self.log(f"timer {what}: {exc!r}")

    def verify(self, uid: str, node: str, annotations: Mapping[str, str]) -> tuple[adapter.Share, ...] | None:
        key = (uid, node, json.dumps(annotations, sort_keys=True))
        if key not in self._verified:
            assert self.stack.keys is not None
            self._verified[key] = adapter.verified_shares(
                verifying_dir=self.stack.keys.verifying_dir, pod_uid=uid, node=node, annotations=annotations)
        return self._verified[key]

    # --- run ---------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        try:
            self.stack.start()
        except BaseException:
            # a daemon that did not come up: the ones that did must not outlive the run
            self.stack.stop(keep=self.o.keep)
            raise
        self.t0 = time.monotonic()
        self.client = Client(self.stack.api.url, timeout_s=5.0)
        self.injector = Injector(self.stack, self.rng, burst=self._burst)
        for node in self.stack.nodes:
            driver = NodeDriver(node, self.stack.api.url, on_running=self._on_running)
            driver.start()
            self.drivers.append(driver)
        self.log(f"stack up in {time.monotonic() - started:.1f}s; churn for {self.o.seconds:.0f}s, seed {self.o.seed}")
        recovery: dict[str, Any] = {}
        leaks: dict[str, Any] = {}
        try:
            self._churn()
            recovery = self._recover()
            leaks = self._drain()
        finally:
            for driver in self.drivers:
                driver.stop()
            self.stack.stop(keep=self.o.keep)
        return report.build(self, recovery=recovery, leaks=leaks)

    def _churn(self) -> None:
        next_create = 0.0
        next_fault = self.rng.expovariate(1.0 / self.o.fault_every_s)
        next_check = 1.0
        next_sample = 0.0
        next_poll = 0.5
        end = self.o.seconds
        while self.now() < end:
            t = self.now()
            if t >= next_create:
                self._create_one()
                next_create = t + self.rng.expovariate(self.o.rate_per_s)
            self._delete_due(t)
            if t >= next_fault:
                self._fault()
                next_fault = t + self.rng.expovariate(1.0 / self.o.fault_every_s)
            self.run_timers()
            if t >= next_poll:
                self._poll_bindings()
                next_poll = t + 1.0
            if t >= next_check:
                self._check()
                next_check = t + 1.0
            if t >= next_sample:
                self._sample()
                next_sample = t + 5.0
            time.sleep(0.05)

    # --- workload ----------------------------------------------------------------------------
    def _create_one(self, *, kind: str | None = None) -> None:
        st = self.state
        st.step += 1
        kind = kind or workload.pick_kind(self.rng)
        shape = self.rng.choices(self.shapes, weights=self.weights)[0]
        lifetime = self.rng.expovariate(1.0 / self.o.lifetime_s)
        if kind == "forged":
            body = self._forged_body(st.step)
        else:
            if kind == "edited":
                shape = workload.Shape(1, self.rng.choice((200, 300, 500)))
            body = workload.pod_manifest(step=st.step, kind=kind, shape=shape)
        assert self.client is not None
        try:
            created = self.client.create(PODS.format(ns=workload.NAMESPACE), body)
        except ApiError as exc:
            self.log(f"step {st.step}: create failed ({exc}); the generator moves on")
            return
        uid = created["metadata"]["uid"]
        st.pods[uid] = PodRecord(step=st.step, kind=kind, name=created["metadata"]["name"], uid=uid,
                                 created_at=self.now(), delete_at=self.now() + 2.0 + lifetime,
                                 faulty=self.now() < self._fault_until)
        st.created += 1
        st.forged += kind == "forged"
        if kind == "edited":
            self.later(self.rng.uniform(4.0, 8.0), f"edit {uid}", lambda: self._edit(uid))

    def _forged_body(self, step: int) -> dict[str, Any]:
        node = self.rng.choice(self.stack.nodes)
        gpu = self.rng.choice(node.gpus)
        replay = None
        if self.rng.random() < 0.5:
            # Another pod's signed allocation, signature and all, pasted onto a new pod.
            for driver in self.drivers:
                for c in driver.running_containers():
                    if adapter.DEVICE_ALLOCATED in c.annotations:
                        replay = c.annotations
                        node = next(n for n in self.stack.nodes if n.name == c.node)
                        break
                if replay:
                    break
        return workload.forged_manifest(step=step, node=node.name, uuid=gpu.uuid, minor=gpu.minor,
                                        memory_bytes=gpu.memory_bytes, replay_from=replay)

    def _edit(self, uid: str) -> None:
        record = self.state.pods.get(uid)
        assert self.client is not None
        if record is None:
            return
        path = f"{PODS.format(ns=workload.NAMESPACE)}/{record.name}"
        pod = self.client.get(path)
        text = ((pod or {}).get("metadata", {}).get("annotations") or {}).get(adapter.DEVICE_ALLOCATED)
        if not text:
            return
        self.client.merge_patch(path, {"metadata": {"annotations": {adapter.DEVICE_ALLOCATED: adapter.edited_allocation(text)}}})
        self.state.edited += 1

    def _burst(self, n: int) -> None:
        for _ in range(n):
            self._create_one(kind="plain")

    def _delete_due(self, t: float) -> None:
        assert self.client is not None
        for record in list(self.state.pods.values()):
            if record.delete_at and t >= record.delete_at:
                try:
                    self.client.delete(f"{PODS.format(ns=workload.NAMESPACE)}/{record.name}", uid=record.uid)
                except ApiError:
                    record.delete_at = t + 1.0  # the API is down: kubectl would retry
                    continue
                record.delete_at = 0.0
                self.state.deleted += 1

    def _on_running(self, uid: str, at: float) -> None:
        record = self.state.pods.get(uid)
        if record is not None and not record.running_at:
            record.running_at = at - self.t0

    # --- faults --------------------------------------------------------------------------------
    def _fault(self) -> None:
        assert self.injector is not None
        kind = self.injector.next_kind()
        fault = self.injector.inject(kind, self.now())
        self.state.faults[kind] += 1
        entry = {"step": self.state.step, "t_s": round(self.now(), 1), "kind": kind, "target": fault.target}
        self.state.fault_log.append(entry)
        self.log(f"fault {entry}")
        window = max(fault.undo_after_s, 0.0) + 10.0
        self._fault_until = max(self._fault_until, self.now() + window)
        if fault.undo is not None:
            self._undo_later(fault.undo_after_s, kind, fault.undo)

    def _undo_later(self, delay_s: float, kind: str, undo: Callable[[], None]) -> None:
        """On a timer thread: the main loop may be blocked on a paused API. `_recover` runs what is left."""
        done = threading.Event()

        def once() -> None:
            with self._lock:
                if done.is_set():
                    return
                done.set()
                try:
                    undo()
                except Exception as exc:
                    self.log(f"undo {kind}: {exc!r}")

        timer = threading.Timer(delay_s, once)
        timer.daemon = True
        timer.start()
        self._undos.append((timer, once))

    # --- checks --------------------------------------------------------------------------------
    def _containers(self) -> list[Any]:
        return [c for d in self.drivers for c in d.running_containers()]

    def _gpus(self) -> dict[str, Any]:
        return {n.name: n.gpus for n in self.stack.nodes}

    def _check(self) -> None:
        containers = self._containers()
        found = invariants.check_containers(containers, gpus=self._gpus(), verify=self.verify,
                                            isolation=self.o.isolation)
        self.state.checks["containers"] += len(containers)
        self.state.checks["rounds"] += 1
        for v in found:
            self.violation(v)

    def _poll_bindings(self) -> None:
        """Pods newly bound by the scheduler: never onto a GPU that was lost before the bind."""
        assert self.client is not None and self.injector is not None
        try:
            pods = self.client.list(ALL_PODS)
        except ApiError:
            return
        self.state.checks["bindings"] += 1
        for pod in pods:
            uid = pod["metadata"]["uid"]
            record = self.state.pods.get(uid)
            node = (pod.get("spec") or {}).get("nodeName")
            if record is None or not node or record.kind == "forged" or getattr(record, "_bound", False):
                continue
            record._bound = True  # type: ignore[attr-defined]
            shares = adapter.allocation_shares(pod["metadata"].get("annotations") or {}) or ()
            for s in shares:
                since = self.injector.lost.get((node, s.uuid))
                # The agent needs its report period to tell the scheduler; 5 s of slack.
                if since is not None and self.now() - since > 8.0:
                    self.violation({"invariant": "no-bind-to-lost-gpu", "node": node, "gpu": s.uuid,
                                    "pod": record.name, "uid": uid,
                                    "detail": f"bound {self.now() - since:.1f}s after the GPU reported Xid 79"})

    def _sample(self) -> None:
        t = self.now()
        for d in [*self.stack.daemons]:
            if not d.alive() or d.proc is None:
                continue
            pid = d.proc.pid
            try:
                with open(f"/proc/{pid}/status") as f:
                    rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
                fds = len(os.listdir(f"/proc/{pid}/fd"))
            except (OSError, StopIteration):
                continue
            self.state.samples[d.name].append((t, float(rss), float(fds), pid))

    # --- recover and drain ----------------------------------------------------------------------
    def _recover(self) -> dict[str, Any]:
        """Undo every fault now; then every pod that fits must be bound and running."""
        self.run_timers(all_now=True)
        for timer, once in self._undos:
            timer.cancel()
            once()
        s = self.stack
        s.api.resume()
        s.api._context.faults.clear()  # queued API faults die with the fault phase
        for d in s.daemons:
            s.restart(d)
        if s.containerd._proc is None:
            s.containerd.start()
        started = self.now()
        self.log("faults stopped; waiting for every pod that fits to be bound and running")
        deadline = started + self.o.recover_timeout_s
        waiting: list[str] | None = []
        while self.now() < deadline:
            self._check()
            waiting = self._not_yet_running()
            if waiting == []:
                break
            time.sleep(1.0)
        took = self.now() - started
        if waiting:
            self.violation({"invariant": "eventually-running",
                            "detail": f"{len(waiting)} pod(s) that fit are not bound and running "
                                      f"{self.o.recover_timeout_s:.0f}s after the faults stopped",
                            "pods": waiting[:20], "scheduler_said": self._last_events(waiting[:20])})
        self._check_scheduler_counts()
        return {"recovered": waiting == [], "time_to_recover_s": round(took, 1)}

    def _last_events(self, waiting: list[str]) -> dict[str, str]:
        """The newest Event message of each waiting pod (FailedScheduling says what the leader saw): context
        to tell a scheduler that cannot place a pod from one that never tried."""
        assert self.client is not None
        wanted = {w.split(" ", 1)[0] for w in waiting}
        try:
            events = self.client.list(f"/api/v1/namespaces/{workload.NAMESPACE}/events")
        except ApiError as exc:
            return {"": f"events unreadable: {exc}"}
        newest: dict[str, tuple[str, str]] = {}
        for e in events:
            name = str((e.get("involvedObject") or {}).get("name") or "")
            stamp = str(e.get("lastTimestamp") or e.get("eventTime") or (e.get("metadata") or {}).get("creationTimestamp") or "")
            if name in wanted and stamp >= newest.get(name, ("", ""))[0]:
                newest[name] = (stamp, f"{stamp} {e.get('reason', '')}: {str(e.get('message', ''))[:300]}")
        return {name: newest[name][1] if name in newest else "no Event" for name in sorted(wanted)}

    def _not_yet_running(self) -> list[str] | None:
        assert self.client is not None
        try:
            pods = self.client.list(ALL_PODS)
        except ApiError:
            return None
        bound = []
        claims = []
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                shares = self.verify(pod["metadata"]["uid"], node, pod["metadata"].get("annotations") or {})
                bound.append((node, shares or ()))
                claim = None if shares else invariants.claim_of(node, pod)
                if claim is not None:
                    claims.append(claim)
        lost = set(self.injector.lost) if self.injector else set()
        free = invariants.free_capacity(bound, self._gpus(), lost, claims)
        tracked = {uid: t for d in self.drivers for uid, t in d.pods().items()}
        waiting = []
        for pod in pods:
            meta = pod["metadata"]
            kind = (meta.get("labels") or {}).get(workload.KIND_LABEL)
            if kind in ("forged", "edited") or meta.get("deletionTimestamp"):
                continue  # forged pods must never run with GPUs; edited ones may rightly be refused
            if not (pod.get("spec") or {}).get("nodeName"):
                if invariants.fits(pod, free):
                    waiting.append(f"{meta['name']} (pending, fits)")
                continue
            t = tracked.get(meta["uid"])
            if t is None or not t.running_at:
                waiting.append(f"{meta['name']} (bound, not running: {t.last_error if t else 'not seen'})")
        return waiting

    def _check_scheduler_counts(self) -> None:
        """Each scheduler's allocated-core gauge per node equals the verified allocations of bound pods:
        a forged or edited allocation is never counted (gauges refresh every ~10 s)."""
        assert self.client is not None
        time.sleep(12.0)
        try:
            pods = self.client.list(ALL_PODS)
        except ApiError:
            return
        want: Counter[str] = Counter()
        extra: Counter[str] = Counter()  # requests of pods whose allocation does not verify
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if node and not pod["metadata"].get("deletionTimestamp"):
                shares = self.verify(pod["metadata"]["uid"], node, pod["metadata"].get("annotations") or {})
                if shares:
                    want[node] += sum(s.core_percent for s in shares)
                else:
                    # By design the scheduler counts such a pod's *request* (it runs there), never the
                    # allocation it carries; a forged one claims more than its request, so they differ.
                    extra[node] += workload.core_request(pod)
        for address in self.stack.scheduler_metrics:
            try:
                text = self.stack.metrics_text(address)
            except OSError:
                continue
            got: Counter[str] = Counter()
            for labels, value in invariants.metric(text, adapter.SCHED_CORE_ALLOCATED):
                got[labels.get("node", "")] += int(value)
            self.state.checks["scheduler-counts"] += 1
            for node in {*want, *got}:
                if node and not want[node] <= got[node] <= want[node] + extra[node]:
                    self.violation({"invariant": "scheduler-counts-only-verified", "node": node,
                                    "scheduler": address,
                                    "detail": f"scheduler counts {got[node]}% of core allocated; verified "
                                              f"allocations of bound pods sum to {want[node]}%, plus at most "
                                              f"{extra[node]}% requested by pods whose allocation does not verify"})

    def _drain(self) -> dict[str, Any]:
        assert self.client is not None
        for record in self.state.pods.values():
            if record.delete_at:  # 0: already deleted
                record.delete_at = 1.0
        deadline = self.now() + 90
        while self.now() < deadline:
            self._delete_due(self.now())
            try:
                left = self.client.list(ALL_PODS)
            except ApiError:
                continue
            for pod in left:
                if not pod["metadata"].get("deletionTimestamp"):
                    meta = pod["metadata"]
                    with contextlib.suppress(ApiError):  # also pods whose create timed out on our side yet landed
                        self.client.delete(f"{PODS.format(ns=meta['namespace'])}/{meta['name']}", uid=meta["uid"])
            if not left and all(d.sandboxes() == 0 for d in self.drivers):
                break
            time.sleep(0.5)
        time.sleep(3.0)
        leaks: dict[str, Any] = {"pods_left": len(self.client.list(ALL_PODS))}
        containers = self.stack.containerd.ctr("containers", "ls", "-q", check=False).split()
        leaks["containerd_containers_left"] = len(containers)
        # Found by UID with no handle on them (a RunPodSandbox whose answer was lost): kubelet's GC does this too.
        leaks["stray_sandboxes_removed"] = sum(d.strays_removed for d in self.drivers)
        for node in self.stack.nodes:
            admitted = -1.0
            for _ in range(30):  # the agent's sweep may take its period
                try:
                    samples = invariants.metric(self.stack.metrics_text(node.agent_metrics), adapter.AGENT_ADMITTED)
                    admitted = samples[0][1] if samples else 0.0
                except OSError:
                    admitted = -1.0
                if admitted == 0:
                    break
                time.sleep(1.0)
            cache = adapter.hami_cache_root(node.root)
            dirs = os.listdir(cache) if os.path.isdir(cache) else []
            leaks[node.name] = {"ledger_entries": admitted, "hami_cache_dirs": len(dirs)}
            if admitted != 0:
                self.violation({"invariant": "no-leaks", "node": node.name,
                                "detail": f"agent still counts {admitted} admitted pods after every pod is gone"})
            if dirs:
                self.violation({"invariant": "no-leaks", "node": node.name,
                                "detail": f"HAMi cache dirs left: {dirs[:5]}"})
        time.sleep(12.0)  # the schedulers' allocation gauges refresh every ~10 s
        for address in self.stack.scheduler_metrics:
            try:
                text = self.stack.metrics_text(address)
            except OSError:
                continue
            held = sum(v for _, v in invariants.metric(text, adapter.SCHED_CORE_ALLOCATED))
            leaks[f"scheduler {address}"] = {"core_allocated_percent": held}
            if held:
                self.violation({"invariant": "no-leaks", "scheduler": address,
                                "detail": f"scheduler still counts {held}% core allocated after every pod is gone"})
        if leaks["pods_left"] or containers:
            self.violation({"invariant": "no-leaks", "detail": f"left after drain: {leaks['pods_left']} pods, "
                                                               f"{len(containers)} containerd containers"})
        return leaks
