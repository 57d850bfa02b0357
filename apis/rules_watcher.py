"""Hot reload of a translation rules file: re-read on change, keeping the last good rules."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from apis.rules_file import RulesError, TranslationRules

# The name reloads were always logged under (apis/translation.py before the split).
log = logging.getLogger("apis.translation")


class RulesWatcher:
    """The rules of one file, re-read when the file changes; a bad edit keeps the last good rules.

    `current()` looks at the file at most every `min_interval_s` (a stat call),
    so callers on the hot path can ask for every pod. A ConfigMap volume swaps a
    symlink on update; stat follows it, so the swap shows as a change.
    """

    def __init__(
        self,
        path: str,
        *,
        min_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._signature = self._stat()
        self._rules = TranslationRules.load(path)  # a bad file at start is the operator's to fix now
        self._checked_at = clock()
        #: Why the latest change was not applied; None after a good load.
        self.last_error: str | None = None
        self.reloads = 0

    def current(self) -> TranslationRules:
        now = self._clock()
        with self._lock:
            if now - self._checked_at >= self._min_interval_s:
                self._checked_at = now
                self._maybe_reload()
            return self._rules

    def _maybe_reload(self) -> None:
        signature = self._stat()
        if signature == self._signature:
            return
        self._signature = signature
        try:
            rules = TranslationRules.load(self.path)
        except RulesError as exc:
            if str(exc) != self.last_error:
                log.warning("keeping the previous translation rules: %s", exc)
            self.last_error = str(exc)
            return
        self._rules = rules
        self.last_error = None
        self.reloads += 1
        log.info("reloaded translation rules from %s: %s", self.path, [r.name for r in rules.rules])

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)
