"""Shared pytest setup. Topic folders keep their own fixtures in their own conftest.py."""

from hypothesis import settings

pytest_plugins = ["tests.kubeapi.fixture"]

# Property tests check what holds, not how fast: on a shared 2-core CI machine one example can
# take 100x its usual time while other tests start daemons, which Hypothesis's default 200 ms
# deadline reports as a (flaky) failure. Speed is measured by bench/, not by tests.
settings.register_profile("fgpu", deadline=None)
settings.load_profile("fgpu")
