"""pytest fixtures for the private containerd; import them into a topic's conftest.py."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.containerd.harness import Containerd, ContainerdError


def _unavailable_reason() -> str | None:
    for tool in ("containerd", "ctr", "runc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install containerd runc busybox-static)"
    if os.geteuid() != 0:
        return "containerd tests need root"
    return None


@pytest.fixture(scope="session")
def containerd() -> Iterator[Containerd]:
    """One containerd for the whole session, with the local images imported."""
    reason = _unavailable_reason()
    if reason:
        pytest.skip(reason)
    ctrd = Containerd()
    try:
        ctrd.start()
        ctrd.import_images()
    except ContainerdError as exc:
        ctrd.cleanup()
        pytest.fail(f"could not start containerd: {exc}")
    try:
        yield ctrd
    finally:
        ctrd.cleanup()
