"""The faults, on a seeded schedule: what each does and what undoes it.

Kinds (each one a function over the stack; `Fault.undo` is run `undo_after_s` later):
- kill9-agent / kill9-proxy / kill9-scheduler: SIGKILL, restart after a short delay
  (an agent killed with pods running rebuilds its ledger from the API);
- containerd-restart: SIGTERM to containerd and start it again (shims and containers live on);
- api-5xx: a burst of 500/503 answers; api-timeout: requests that never answer;
- api-drop-watches: every watch cut mid-stream;
- api-410: the history compacted, then watches cut, so every resume meets 410 Gone;
- api-pause: every request hangs for a few seconds;
- lease-expiry: the leader SIGSTOPped right after a burst of pods (while it binds),
  past its lease, then SIGCONT;
- gpu-lost: the agent restarted on an inventory whose GPU reports Xid 79; undone by
  a restart on the healthy inventory (the fake NVML has no runtime control in
  --fake-nvml mode, so loss and recovery each cost an agent restart).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.soak.stack import SoakStack, write_lost_inventory

KINDS = (
    "kill9-agent", "kill9-proxy", "kill9-scheduler", "containerd-restart", "api-5xx", "api-timeout",
    "api-drop-watches", "api-410", "api-pause", "lease-expiry", "gpu-lost",
)


@dataclass
class Fault:
    kind: str
    target: str
    undo: Callable[[], None] | None = None
    undo_after_s: float = 0.0
    info: dict[str, Any] | None = None


class Injector:
    def __init__(self, stack: SoakStack, rng: random.Random, *, burst: Callable[[int], None]) -> None:
        self.stack = stack
        self.rng = rng
        self._burst = burst
        self._cycle: list[str] = []
        #: (node, uuid) of GPUs that are lost right now, with the time they went
        self.lost: dict[tuple[str, str], float] = {}

    def next_kind(self) -> str:
        """Every kind once per round, in a seeded order: every kind gets covered in a short run."""
        if not self._cycle:
            self._cycle = list(KINDS)
            self.rng.shuffle(self._cycle)
        return self._cycle.pop()

    def inject(self, kind: str, now: float) -> Fault:
        s, rng = self.stack, self.rng
        if kind in ("kill9-agent", "kill9-proxy"):
            node = rng.choice(s.nodes)
            daemon = node.agent if kind == "kill9-agent" else node.proxy
            s.kill9(daemon)
            return Fault(kind, daemon.name, lambda: s.restart(daemon), rng.uniform(0.5, 3.0))
        if kind == "kill9-scheduler":
            daemon = rng.choice(s.schedulers)
            leader = daemon.pid == s.leader_pid()
            s.kill9(daemon)
            return Fault(kind, f"{daemon.name} ({'leader' if leader else 'standby'})",
                         lambda: s.restart(daemon), rng.uniform(0.5, 3.0))
        if kind == "containerd-restart":
            s.containerd.stop()
            return Fault(kind, "containerd", s.containerd.start, rng.uniform(0.5, 2.0))
        if kind == "api-5xx":
            n = rng.randint(5, 40)
            s.api.fail_next(n, status=rng.choice((500, 503)))
            return Fault(kind, f"next {n} requests", None, 0, {"n": n})
        if kind == "api-timeout":
            n = rng.randint(1, 4)
            s.api.fail_next(n, timeout=True)
            return Fault(kind, f"next {n} requests hang", None, 0)
        if kind == "api-drop-watches":
            s.api.drop_watches()
            return Fault(kind, "all watches")
        if kind == "api-410":
            rv = s.api.compact()
            s.api.drop_watches()
            return Fault(kind, f"compacted at rv {rv}")
        if kind == "api-pause":
            s.api.pause()
            return Fault(kind, "api", s.api.resume, rng.uniform(1.0, 5.0))
        if kind == "lease-expiry":
            self._burst(3)
            stopped = s.leader()
            if stopped is None or stopped.proc is None:
                return Fault(kind, "no leader to stop")
            import os
            import signal

            pid = stopped.proc.pid
            os.kill(pid, signal.SIGSTOP)

            def cont() -> None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

            return Fault(kind, f"{stopped.name} stopped", cont, s.lease_s * 1.5 + 1.0)
        if kind == "gpu-lost":
            node = rng.choice(s.nodes)
            if node.lost_gpu >= 0:
                return Fault(kind, f"{node.name} already has a lost GPU")
            gpu = rng.choice(node.gpus)
            node.lost_gpu = gpu.minor
            s.restart_agent_with(node, write_lost_inventory(node, gpu.minor))
            self.lost[node.name, gpu.uuid] = now + 1.0

            def recover() -> None:
                s.restart_agent_with(node, node.inventory)
                node.lost_gpu = -1
                self.lost.pop((node.name, gpu.uuid), None)

            return Fault(kind, f"{node.name} {gpu.uuid}", recover, rng.uniform(8.0, 15.0))
        raise ValueError(f"unknown fault kind {kind!r}; one of {', '.join(KINDS)}")
