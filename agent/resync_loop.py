"""A background loop that runs one report pass on change or every resync period, retrying with backoff.

The agent never exits because a peer (the API server, the scheduler, the
container runtime) is down or slow: a failed pass is retried with jittered
exponential backoff (tenacity) until it succeeds or the agent stops, and the
next pass reads the devices afresh, so what is reported once the peer is back is current.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from tenacity import RetryCallState, RetryError, Retrying, retry_if_exception_type, stop_when_event_set
from tenacity import wait_exponential_jitter as backoff

from agent.errors import KubeAPIError, RuntimeUnavailable, SchedulerUnavailable
from agent.metrics import AgentMetrics

log = logging.getLogger(__name__)

RETRIED = (KubeAPIError, RuntimeUnavailable, SchedulerUnavailable)


class ReportLoop:
    def __init__(
        self,
        *,
        target: str,
        report: Callable[[], object],
        resync_s: float,
        metrics: AgentMetrics,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
    ) -> None:
        self.target = target
        self._report = report
        self._resync = resync_s
        self._metrics = metrics
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._backoff = backoff(multiplier=backoff_initial_s, max=backoff_max_s)
        self._thread = threading.Thread(target=self._run, name=f"report-{target}", daemon=True)
        #: Successful passes; tests wait on it.
        self.passes = 0
        self.failures = 0

    def start(self) -> None:
        self._thread.start()

    def poke(self) -> None:
        """Something changed: run a pass soon."""
        self._wake.set()

    def stop(self, grace: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(grace)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._pass()
            self._wake.wait(self._resync)
            self._wake.clear()

    def _pass(self) -> None:
        retrying = Retrying(
            stop=stop_when_event_set(self._stop),
            wait=self._backoff,
            retry=retry_if_exception_type(RETRIED),
            sleep=self._sleep,
            before_sleep=self._log_retry,
        )
        try:
            for attempt in retrying:
                with attempt:
                    started = time.monotonic()
                    self._report()
                    self._metrics.report_seconds.labels(self.target).observe(time.monotonic() - started)
                    self.passes += 1
        except RetryError:
            pass  # stopping
        except Exception:
            # A bug in a pass must not end reporting; the next resync tries again.
            log.exception("%s report failed unexpectedly", self.target)

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _log_retry(self, state: RetryCallState) -> None:
        self.failures += 1
        self._metrics.report_errors.labels(self.target).inc()
        err = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        log.warning("%s report failed (attempt %d): %s; retrying in %.1fs", self.target, state.attempt_number, err, delay)
