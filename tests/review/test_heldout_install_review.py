"""Review of the Helm install with values nobody tried: a platform engineer's install, as an outside checker.

The chart is rendered by Helm's own engine (helm-python-sdk, as tests/deploy_chart/ does) as release
`gpu-share` in namespace `gpu-ops` with tests/review/install/heldout-values.yaml: a private registry
pinned by digest, pull secrets, a newer kube-scheduler, placement and resources for every daemon, two
pools (one overcommitted), cert-manager with a ClusterIssuer, every optional component on. The first
tests guard what works; each strict xfail is a defect found by this review, to be unmarked by its fix.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy_chart import chart
from tests.deploy_chart.crd_kinds import CUSTOM_KINDS, custom_kind_errors

RELEASE = "gpu-share"
NAMESPACE = "gpu-ops"
VALUES = Path(__file__).parent / "install" / "heldout-values.yaml"
#: The oldest Kubernetes the chart admits (Chart.yaml kubeVersion), a middle one and the newest known.
VERSIONS = ("1.30.0", "1.32.0", kubernetes_validate.utils.latest_version())

Doc = dict[str, Any]


def heldout() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(VALUES.read_text())
    return loaded


def merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in extra.items():
        out[key] = merged(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) else value
    return out


def render(values: Mapping[str, Any]) -> list[Doc]:
    """`helm template gpu-share deploy/chart -n gpu-ops -f values`, every object."""
    chart.need_helm()
    import helm_python

    from hack import render_manifests

    with helm_python.Chart.load(str(render_manifests.CHART)) as loaded:
        rendered = loaded.render(dict(values), name=RELEASE, namespace=NAMESPACE)
    return [d for _, text in sorted(rendered.items()) for d in yaml.safe_load_all(text) if d]


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_template(workload: Doc) -> Doc:
    template: Doc = workload["spec"]["template"]
    return template


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return render(heldout())


# --- what works (guards) -----------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_of_the_heldout_install_validates(docs: list[Doc], version: str) -> None:
    failures = []
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if (doc["apiVersion"].split("/")[0], doc["kind"]) in CUSTOM_KINDS:
            failures += [f"{where}: {e}" for e in custom_kind_errors(doc)]
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}")
    assert failures == []


def test_helm_lint_strict_is_clean_for_every_supported_kubernetes() -> None:
    chart.need_helm()
    import helm_python

    from hack import render_manifests

    for version in (*VERSIONS, None):
        kube = None if version is None else f"v{version}"
        report = helm_python.lint(render_manifests.CHART, heldout(), strict=True, namespace=NAMESPACE, kube_version=kube)
        assert report["errors"] == [], (kube, report)
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], (kube, report)


def test_another_namespace_reaches_every_object_and_identity(docs: list[Doc]) -> None:
    text = yaml.safe_dump_all(docs)
    assert "fgpu-system" not in text
    for doc in docs:
        ns = doc["metadata"].get("namespace")
        if doc["kind"] == "RoleBinding" and ns == "kube-system":  # kube-scheduler's authentication reader
            continue
        assert ns in (None, NAMESPACE), f"{doc['kind']}/{doc['metadata']['name']} in {ns}"
        for subject in doc.get("subjects", []):
            if subject.get("kind") == "ServiceAccount":
                assert subject["namespace"] == NAMESPACE
    for policy in [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]:
        for condition in policy["spec"]["matchConditions"]:
            assert f"system:serviceaccount:{NAMESPACE}:" in condition["expression"]
    certificate = one(docs, "Certificate", "fgpu-webhook")
    assert f"fgpu-webhook.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    assert certificate["spec"]["issuerRef"]["kind"] == "ClusterIssuer"


def test_selectors_services_and_images_are_consistent(docs: list[Doc]) -> None:
    workloads = [d for d in docs if d["kind"] in ("Deployment", "DaemonSet")]
    for w in workloads:
        labels = pod_template(w)["metadata"]["labels"]
        assert matches(w["spec"]["selector"]["matchLabels"], labels), w["metadata"]["name"]
        spec = pod_template(w)["spec"]
        assert spec.get("imagePullSecrets") == [{"name": "corp-pull"}], w["metadata"]["name"]
        for c in spec["containers"] + spec.get("initContainers", []):
            assert c["image"].startswith("registry.corp.example/") and "@sha256:" in c["image"], c["image"]
    for svc in [d for d in docs if d["kind"] == "Service"]:
        backing = [w for w in workloads if matches(svc["spec"]["selector"], pod_template(w)["metadata"]["labels"])]
        assert backing, f"Service {svc['metadata']['name']} selects no pods"
        for port in svc["spec"]["ports"]:
            named = {p.get("name") for w in backing for c in pod_template(w)["spec"]["containers"] for p in c.get("ports", [])}
            assert port["targetPort"] in named, (svc["metadata"]["name"], port)
    agent = one(docs, "DaemonSet", "fgpu-agent-infer")
    assert pod_template(agent)["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.present": "true", "node.corp.example/gpu": "yes", "node.corp.example/pool": "inference"}
    assert pod_template(agent)["spec"]["priorityClassName"] == "gpu-node-critical"


def test_the_webhooks_never_cover_kube_system_or_fgpus_namespace(docs: list[Doc]) -> None:
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (hook,) = one(docs, kind, "fgpu-webhook")["webhooks"]
        selector = hook["namespaceSelector"]
        assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                "values": ["kube-system", NAMESPACE]} in selector["matchExpressions"], kind
        assert selector["matchLabels"] == {"gpu.corp.example/enabled": "true"}
        assert hook["clientConfig"]["service"]["namespace"] == NAMESPACE
    (mutating,) = one(docs, "MutatingWebhookConfiguration", "fgpu-webhook")["webhooks"]
    assert mutating["failurePolicy"] == "Ignore"


def test_an_upgrade_with_the_same_values_restarts_no_pod(docs: list[Doc]) -> None:
    again = render(heldout())
    for w in [d for d in docs if d["kind"] in ("Deployment", "DaemonSet")]:
        assert pod_template(one(again, w["kind"], w["metadata"]["name"])) == pod_template(w), w["metadata"]["name"]


# --- defects found ------------------------------------------------------------------------------------

#: Values that reach only a ConfigMap its daemon reads once at start (scheduler_plugin/main.py
#: resolve_config; webhook/main.py "the config file is read once"), with the workload that must roll.
CONFIG_ONLY_CHANGES: dict[str, tuple[dict[str, Any], str, str]] = {
    "scheduler-policy": ({"scheduler": {"policy": "binpack"}}, "fgpu-scheduler", "fgpu-scheduler-config"),
    "scheduler-assume-ttl": ({"scheduler": {"assumeTTLSeconds": 120}}, "fgpu-scheduler", "fgpu-scheduler-config"),
    "webhook-scheduler-injection": ({"webhook": {"schedulerInjection": {"excludeNamespaces": ["batch"]}}},
                                    "fgpu-webhook", "fgpu-webhook-config"),
}


@pytest.mark.parametrize("change", sorted(CONFIG_ONLY_CHANGES))
def test_a_config_only_upgrade_rolls_the_daemon_that_reads_it_once(docs: list[Doc], change: str) -> None:
    extra, deployment, config_map = CONFIG_ONLY_CHANGES[change]
    upgraded = render(merged(heldout(), extra))
    assert one(upgraded, "ConfigMap", config_map)["data"] != one(docs, "ConfigMap", config_map)["data"]
    before = pod_template(one(docs, "Deployment", deployment))
    after = pod_template(one(upgraded, "Deployment", deployment))
    assert after != before, f"helm upgrade with {extra} does not restart {deployment}, which reads that value only at start"


def test_the_descheduler_is_scraped_when_service_monitors_are_on(docs: list[Doc]) -> None:
    service = one(docs, "Service", "fgpu-descheduler")
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"
                and matches(d["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])]
    assert monitors, "no ServiceMonitor selects Service fgpu-descheduler"


def test_the_webhooks_priority_class_and_placement_can_be_set() -> None:
    placement = {"priorityClassName": "corp-high", "nodeSelector": {"node-role.corp.example/infra": "true"},
                 "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}]}
    spec = pod_template(one(render(merged(heldout(), {"webhook": placement})), "Deployment", "fgpu-webhook"))["spec"]
    assert {k: spec.get(k) for k in placement} == placement


def test_affinity_for_the_agent_and_the_scheduler_is_honoured() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "node.corp.example/reserved", "operator": "DoesNotExist"}]}]}}}
    docs = render(merged(heldout(), {"agent": {"affinity": affinity}, "scheduler": {"affinity": affinity}}))
    for kind, name in (("DaemonSet", "fgpu-agent"), ("Deployment", "fgpu-scheduler")):
        got = pod_template(one(docs, kind, name))["spec"].get("affinity", {}).get("nodeAffinity")
        assert got == affinity["nodeAffinity"], f"{kind}/{name} has no nodeAffinity from values"


def test_event_rights_are_what_the_code_calls(docs: list[Doc]) -> None:
    # scheduler_plugin/kube.py: create_event (create_namespaced_event) and list_events (the descheduler's
    # rate-limit rebuild); no event patch anywhere.
    wanted = {"fgpu-scheduler": {"create"}, "fgpu-descheduler": {"create", "list"}}
    for name, verbs in wanted.items():
        rules = one(docs, "ClusterRole", name)["rules"]
        granted = {v for r in rules if "events" in r["resources"] for v in r["verbs"]}
        assert granted == verbs, f"ClusterRole {name} grants {sorted(granted)} on events; the code calls {sorted(verbs)}"
