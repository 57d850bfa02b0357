"""The web view's defrag plan: `fgpuctl defrag-plan` on a sample's snapshot, in a child process, within a time budget.

At 1,000 nodes a plan costs seconds of CPU, far more than the rest of a sample, so the view makes
it apart from the cheap views and less often (`ui_server`). It runs in a child process for two
reasons: a plan that runs past its budget can be stopped (a thread can't be), and the planner's
CPU time doesn't hold the server's GIL while browsers are being answered. The child is forked
from a fork server that has imported the planner already (not from the threaded server itself),
so starting one costs milliseconds, not an interpreter and numpy.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from fgpuctl.ui_model import Planning

JSON = dict[str, Any]

#: what the child imports once, in the fork server, so each plan starts warm
_PRELOAD = ["fgpuctl.ui_plan", "scheduler_plugin.sim.defrag"]


@dataclass(frozen=True)
class DefragShape:
    """The pending shape the defrag plan makes room for (`fgpuctl defrag-plan --gpus/--gpu-milli`)."""

    gpus: int = 1
    gpu_milli: int = 1000
    max_moves: int = 10
    policy: str = "fgpu"


@dataclass(frozen=True)
class PlanOutcome:
    #: the plan in `fgpuctl defrag-plan --json`'s shape; None when none came back in time
    plan: JSON | None
    #: why not ("" with a plan): the budget ran out, the planner failed, or the view stopped
    failure: str
    took_s: float


def plan_json(planning: Planning, shape: DefragShape) -> JSON:
    """`fgpuctl defrag-plan --json` for `shape` on `planning`'s snapshot (runs in this process)."""
    from scheduler_plugin.sim.defrag import plan_defrag
    from scheduler_plugin.sim.trace import TracePod

    pending = TracePod(name="pending", cpu_milli=0, memory_mib=0, num_gpu=shape.gpus, gpu_milli=shape.gpu_milli)
    plan = plan_defrag(planning.snapshot, pending=pending, max_moves=shape.max_moves, policy=shape.policy)
    from fgpuctl.defrag import plan_document

    return plan_document(pending, plan, planning.notes)


class PlanRunner:
    """Makes one plan at a time in a child process and stops it when it runs past `budget_s`."""

    def __init__(self, shape: DefragShape, *, budget_s: float) -> None:
        self.shape = shape
        self.budget_s = budget_s
        self._lock = threading.Lock()
        self._child: BaseProcess | None = None
        self._stopped = False

    def run(self, planning: Planning) -> PlanOutcome:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(_PRELOAD)
        receiver, sender = context.Pipe(duplex=False)
        started = time.monotonic()
        child = context.Process(target=_child, args=(sender, planning, self.shape), name="fgpuctl-ui-defrag", daemon=True)
        with self._lock:
            if self._stopped:
                return PlanOutcome(None, "the view is stopping", 0.0)
            # start() sends the snapshot to the child; it counts against the budget like the plan itself.
            child.start()
            self._child = child
        sender.close()
        try:
            return self._wait(receiver, started, len(planning.snapshot.nodes))
        finally:
            receiver.close()
            if child.is_alive():
                child.kill()
            child.join()
            with self._lock:
                self._child = None

    def _wait(self, receiver: Connection, started: float, nodes: int) -> PlanOutcome:
        left = self.budget_s - (time.monotonic() - started)
        # poll() is also true when the child died without answering; recv() then raises EOFError.
        if left > 0 and receiver.poll(left):
            try:
                kind, value = receiver.recv()
            except EOFError:
                with self._lock:
                    why = "the view is stopping" if self._stopped else "the planner's process died without a plan (out of memory?)"
                return PlanOutcome(None, why, time.monotonic() - started)
            took = time.monotonic() - started
            if kind == "plan":
                return PlanOutcome(value, "", took)
            return PlanOutcome(None, f"the planner failed: {value}", took)
        with self._lock:
            stopping = self._stopped
        took = time.monotonic() - started
        if stopping:
            return PlanOutcome(None, "the view is stopping", took)
        return PlanOutcome(
            None,
            f"the plan ran past its budget of {self.budget_s:g} s (--defrag-budget) on {nodes} nodes and was stopped; "
            "raise --defrag-budget or lower --max-moves",
            took,
        )

    def stop(self) -> None:
        """Stops a plan in progress (its `run` returns at once) and refuses new ones."""
        with self._lock:
            self._stopped = True
            child = self._child
        if child is not None and child.is_alive():
            child.kill()


def _child(sender: Connection, planning: Planning, shape: DefragShape) -> None:
    try:
        sender.send(("plan", plan_json(planning, shape)))
    except Exception as exc:  # the parent shows it on the page; the traceback would go nowhere useful
        sender.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        sender.close()
