"""The scheduler settings shipped in hack/deploy, read with the scheduler's own loader."""

from __future__ import annotations

import pytest

from scheduler_plugin import config as scheduler_config
from tests.localup.manifests import Doc, embedded_yaml, find, standalone_docs


@pytest.mark.parametrize("docs", [None, standalone_docs()], ids=["extender-mode", "standalone"])
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


def test_the_default_deployment_is_the_kube_scheduler_extender_not_standalone() -> None:
    default = scheduler_config.from_mapping(embedded_yaml("ConfigMap", "fgpu-scheduler-config", "scheduler.yaml"))
    standalone = scheduler_config.from_mapping(
        embedded_yaml("ConfigMap", "fgpu-scheduler-config", "scheduler.yaml", docs=standalone_docs())
    )

    assert default.standalone is False and default.extender_listen == "127.0.0.1:9444"
    assert standalone.standalone is True
