from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kubectl_plugin import cluster
from tests.kubectl_plugin.agents import agents


@pytest.fixture(scope="module")
def agent_ports() -> Iterator[dict[str, int]]:
    """The two nodes' agent endpoints (read-only, so shared by a module's tests): node -> port."""
    with agents(*((node, gpus, procs) for node, (gpus, procs) in cluster.PROCESSES.items())) as ports:
        yield ports
