"""The scheduler settings shipped in hack/deploy, read with the scheduler's own loader."""

from __future__ import annotations

import pytest

from scheduler_plugin import config as scheduler_config
from tests.localup.manifests import Doc, embedded_yaml, extender_docs, find


@pytest.mark.parametrize("docs", [None, extender_docs()], ids=["standalone", "extender-mode"])
def test_every_shipped_scheduler_config_elects_on_a_lease_the_schedulers_role_grants(
    docs: tuple[Doc, ...] | None,
) -> None:
    # The scheduler elects whenever its state is kubernetes, extender mode included.
    config = scheduler_config.from_mapping(embedded_yaml("ConfigMap", "fgpu-scheduler-config", "scheduler.yaml", docs=docs))
    election = config.leader_election
    assert config.state is scheduler_config.StateBackend.KUBERNETES and election.enabled

    role = find("Role", "fgpu-scheduler-leader-election")
    assert role["metadata"]["namespace"] == election.namespace
    granted = {verb for rule in role["rules"] if election.lease_name in rule.get("resourceNames", []) for verb in rule["verbs"]}
    assert {"get", "update"} <= granted
