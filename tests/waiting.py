"""Waiting on a condition another thread or process makes true, for tests of running daemons."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], *, timeout: float = 20.0, step: float = 0.02) -> None:
    """Polls `condition` until it holds; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(step)
