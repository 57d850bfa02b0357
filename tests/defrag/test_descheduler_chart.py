"""The chart's fgpu-descheduler: off by default, dry-run when on, flags its own parser accepts, least rights."""

from __future__ import annotations

from typing import Any

from apis import names
from scheduler_plugin.descheduler.main import build_parser, settings_from
from tests.deploy_chart.chart import container, one, render


def _command(values: dict[str, Any]) -> list[str]:
    deployment = one(render(values), "Deployment", "fgpu-descheduler")
    return list(container(deployment, "descheduler")["command"])


def test_the_default_install_has_no_descheduler() -> None:
    assert not [d.id for d in render({}) if "descheduler" in d.name]


def test_enabled_it_runs_in_dry_run_with_flags_its_own_parser_reads_as_the_values_say() -> None:
    command = _command({"descheduler": {"enabled": True, "pendingSeconds": 120, "consolidation": {"everySeconds": 900}}})
    assert command[0] == "fgpu-descheduler"
    parser = build_parser()
    settings, limits = settings_from(parser.parse_args(command[1:]), parser)
    assert limits.dry_run
    assert settings.room.pending_s == 120
    assert settings.room.min_fragmentation == 0.25
    assert settings.consolidation.every_s == 900
    assert (limits.per_hour, limits.per_node_per_hour) == (10, 2)


def test_dry_run_off_adds_the_flag_that_evicts() -> None:
    parser = build_parser()
    command = _command({"descheduler": {"enabled": True, "dryRun": False}})
    _, limits = settings_from(parser.parse_args(command[1:]), parser)
    assert not limits.dry_run


def test_its_only_write_to_pods_is_the_eviction_subresource() -> None:
    role = one(render({"descheduler": {"enabled": True}}), "ClusterRole", "fgpu-descheduler")
    pod_verbs = {
        (resource, verb)
        for rule in role["rules"]
        if "" in rule["apiGroups"]
        for resource in rule["resources"]
        if resource.startswith("pods")
        for verb in rule["verbs"]
    }
    writes = {(r, v) for r, v in pod_verbs if v not in ("get", "list", "watch")}
    assert writes == {("pods/eviction", "create")}


def test_it_may_read_the_owners_and_its_events_and_records_its_stop_in_its_own_namespace() -> None:
    docs = render({"descheduler": {"enabled": True}}, namespace="gpu-ops")
    rules = one(docs, "ClusterRole", "fgpu-descheduler")["rules"]
    granted = {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    assert {("apps", "replicasets", "list"), ("apps", "statefulsets", "list"), ("batch", "jobs", "list"), ("", "events", "list")} <= granted
    role = one(docs, "Role", "fgpu-descheduler")
    assert role["metadata"]["namespace"] == "gpu-ops"
    assert {(r["resources"][0], v, tuple(r.get("resourceNames", ()))) for r in role["rules"] for v in r["verbs"]} == {
        ("configmaps", "get", (names.DESCHEDULER_STOP_CONFIGMAP,)), ("configmaps", "create", ())}
    assert one(docs, "RoleBinding", "fgpu-descheduler")["roleRef"]["name"] == "fgpu-descheduler"
    command = list(container(one(docs, "Deployment", "fgpu-descheduler"), "descheduler")["command"])
    assert build_parser().parse_args(command[1:]).namespace == "gpu-ops"
