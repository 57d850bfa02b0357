"""Reclaim in the running agent: a thread that re-reads the pool's settings file and runs the loop.

Each pass (every `interval` of the settings):
1. the settings file (`agent.reclaim_settings.SettingsFile`) is re-read if it changed; a bad file is
   logged once per distinct error and the last good settings stay in force. Until a first good read
   nothing is evicted: defaults the pool never chose must not evict anyone;
2. the node's `fgpu.io/burstable-ratio` label is kept equal to the settings' `ratio`, so the
   scheduler's rule and the node's reclaim read one file. A node whose isolation backend is `none`
   cannot bound a burst at all: its label is removed instead, and the scheduler sends it no
   burstable pod (its hook would refuse one anyway);
3. one `ReclaimLoop.cycle()`.

Until the settings file has read cleanly once the label is removed too: no reclaim runs then, and a
node without reclaim must not take burstable pods.

An agent whose pool does not overcommit (`overcommit: ""`) runs `NoReclaim` instead: the label is
this agent's to write, so it removes the one an earlier configuration left (a pool whose overcommit
was dropped on a `helm upgrade`), retrying until the API takes it, then stops. The scheduler reads
the label alone; between the agent's start and the removal (one API call, retried every second
while the API is down) it may still place a burstable pod there, which then runs without reclaim
until it ends (docs/overcommit.md).

Nothing here raises into the daemon: a failed label write is retried on the next pass.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from agent.reclaim_loop import ReclaimLoop
from agent.reclaim_settings import SettingsFile
from apis import names

log = logging.getLogger(__name__)

#: NoReclaim's longest wait between attempts while the API refuses the label's removal
_MAX_RETRY_S = 30.0


class NodeLabels(Protocol):
    def patch_node_labels(self, name: str, labels: dict[str, str | None]) -> object: ...


class RatioLabel:
    """The node's `fgpu.io/burstable-ratio` label: written only when it should change, retried on failure."""

    def __init__(self, *, node_name: str, labels: NodeLabels | None) -> None:
        self._node = node_name
        self._labels = labels
        #: the label value last written (None: removed); unset until a first write succeeded
        self._published: tuple[str | None] | None = None

    def publish(self, wanted: str | None, *, why: str = "") -> bool:
        """Makes the label `wanted` (None: absent); True once it is. Never raises."""
        if self._labels is None:
            return True
        if self._published == (wanted,):
            return True
        try:
            self._labels.patch_node_labels(self._node, {names.NODE_BURSTABLE_RATIO: wanted})
        except Exception as exc:
            log.warning("reclaim: cannot set node label %s=%s (retrying): %s", names.NODE_BURSTABLE_RATIO, wanted, exc)
            return False
        if wanted is None and why:
            log.warning("reclaim: %s: node label %s removed, no burstable pods here", why, names.NODE_BURSTABLE_RATIO)
        self._published = (wanted,)
        return True


class NoReclaim:
    """An agent that runs no reclaim: removes the node's ratio label (retrying), then ends."""

    def __init__(self, *, node_name: str, labels: NodeLabels, retry_s: float = 1.0) -> None:
        self.label = RatioLabel(node_name=node_name, labels=labels)
        self._retry_s = retry_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="no-reclaim", daemon=True)
        #: set once the label is gone; tests wait on it
        self.done = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self, grace: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(grace)

    def _run(self) -> None:
        wait = self._retry_s
        while not self._stop.is_set():
            # The patch removes a label that is absent without error, so no read is needed first.
            if self.label.publish(None):
                self.done.set()
                return
            self._stop.wait(wait)
            wait = min(wait * 2, _MAX_RETRY_S)


class ReclaimService:
    def __init__(
        self, *, settings: SettingsFile, loop: ReclaimLoop, node_name: str, isolation: str,
        labels: NodeLabels | None,
    ) -> None:
        self.settings = settings
        self.loop = loop
        self._isolation = isolation
        self.label = RatioLabel(node_name=node_name, labels=labels)
        self._reported_error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reclaim", daemon=True)
        #: Completed passes; tests wait on it.
        self.passes = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, grace: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(grace)

    def step(self) -> None:
        """One pass; never raises."""
        try:
            self._pass()
        except Exception:  # a bug here must not stop the agent; the next pass tries again
            log.exception("reclaim: pass failed unexpectedly")
        self.passes += 1

    def _pass(self) -> None:
        file = self.settings
        if file.reload():
            current = file.current
            self.loop.configure(current.policy, dry_run=current.dry_run)
            log.info("reclaim: settings from %s: %s", file.path, current)
        if file.error != self._reported_error:
            self._reported_error = file.error
            if file.error:
                log.error("reclaim: %s", file.error)
        if not file.loaded:
            self.label.publish(None, why=f"no valid settings file {file.path} yet, so no reclaim")
            return
        if self._isolation == names.ISOLATION_NONE:
            self.label.publish(None, why=f"isolation backend {self._isolation} bounds no burst")
        else:
            self.label.publish(f"{file.current.ratio:g}")
        self.loop.cycle()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.settings.current.interval_s)
