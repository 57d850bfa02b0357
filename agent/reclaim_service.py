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


class NodeLabels(Protocol):
    def patch_node_labels(self, name: str, labels: dict[str, str | None]) -> object: ...


class ReclaimService:
    def __init__(
        self, *, settings: SettingsFile, loop: ReclaimLoop, node_name: str, isolation: str,
        labels: NodeLabels | None,
    ) -> None:
        self.settings = settings
        self.loop = loop
        self._node = node_name
        self._isolation = isolation
        self._labels = labels
        #: the label value last written (None: removed); unset until a first write succeeded
        self._published: tuple[str | None] | None = None
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
            return
        self._publish_ratio(file.current.ratio)
        self.loop.cycle()

    def _publish_ratio(self, ratio: float) -> None:
        if self._labels is None:
            return
        wanted = None if self._isolation == names.ISOLATION_NONE else f"{ratio:g}"
        if self._published == (wanted,):
            return
        try:
            self._labels.patch_node_labels(self._node, {names.NODE_BURSTABLE_RATIO: wanted})
        except Exception as exc:
            log.warning("reclaim: cannot set node label %s=%s (retrying): %s", names.NODE_BURSTABLE_RATIO, wanted, exc)
            return
        if wanted is None:
            log.warning("reclaim: isolation backend %s bounds no burst: node label %s removed, no burstable pods here",
                        self._isolation, names.NODE_BURSTABLE_RATIO)
        self._published = (wanted,)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.settings.current.interval_s)
