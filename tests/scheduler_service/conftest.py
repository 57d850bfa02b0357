from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scheduler_plugin.backend_embedded import EmbeddedBackend
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.scheduling import SchedulingService
from tests.signing_keys import signing_key, write_signing_key

KEY = signing_key("test-cluster-key")


@pytest.fixture
def key_file(tmp_path: Path) -> str:
    return write_signing_key(str(tmp_path / "signing-key"), KEY)


@pytest.fixture
def embedded_service(tmp_path: Path) -> Iterator[Callable[[], SchedulingService]]:
    """Builds a service on one SQLite file; calling it again is a scheduler restart."""
    db = str(tmp_path / "state.db")
    opened: list[EmbeddedBackend] = []

    def build() -> SchedulingService:
        for backend in opened:
            backend.stop()
        opened.clear()
        backend = EmbeddedBackend(path=db)
        opened.append(backend)
        # binpack, as these tests were written against (the core's default is now fgpu, as the service's).
        service = SchedulingService(core_factory=lambda: Scheduler(policy="binpack"), backend=backend, signing_key=KEY)
        backend.start(service)
        return service

    yield build
    for backend in opened:
        backend.stop()
