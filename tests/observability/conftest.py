from __future__ import annotations

import pytest

from tests.observability.exported import exported_by_daemon


@pytest.fixture(scope="session")
def exported() -> set[str]:
    """Every metric name any fgpu daemon exports."""
    return set().union(*exported_by_daemon().values())
