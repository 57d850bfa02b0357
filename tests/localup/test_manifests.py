"""hack/deploy/: every object validates offline against the Kubernetes schemas, and the pieces fit together.

kubernetes-validate checks each object against the OpenAPI schema of its
kind (strict: unknown fields fail). Two kinds need more:
- the Device CRD validates as a CustomResourceDefinition like any object, and
  the Device the agent actually prints is checked against the CRD's own
  openAPIV3Schema (tests/apis_codec/crd_schema.py);
- the KubeSchedulerConfiguration is a component config the API server never
  serves, so it sits in a ConfigMap (validated as such) and its content is
  checked against a schema written from the kube-scheduler v1 Go types
  (tests/localup/kubescheduler_schema.py).
Configs embedded in ConfigMaps are loaded by the component's own loader, so a
key the component does not know fails here rather than at startup.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate
import pytest

from agent.config import parse_config
from apis import names
from apis.translation import TranslationRules
from runtimeproxy.config import ProxyConfig
from scheduler_plugin import config as scheduler_config
from scheduler_plugin.extender import MANAGED_RESOURCES
from tests.apis_codec.crd_schema import pruned_paths, validation_errors
from tests.deploy_chart.crd_kinds import CUSTOM_KINDS, custom_kind_errors
from tests.localup import kubescheduler_schema
from tests.localup.manifests import (
    DEPLOY,
    NAMESPACE,
    REPO,
    Doc,
    all_docs,
    base_docs,
    container,
    embedded_yaml,
    find,
    mount_path_of,
    pod_spec,
    standalone_docs,
    volume,
    webhook_docs,
)

#: The oldest Kubernetes the manifests support (ValidatingAdmissionPolicy is v1 from 1.30), and the newest known.
VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("doc", all_docs(), ids=lambda d: d.id)
def test_every_manifest_validates_against_the_kubernetes_schemas(doc: Doc, version: str) -> None:
    if (doc.obj["apiVersion"].split("/")[0], doc.kind) in CUSTOM_KINDS:  # cert-manager's and the Prometheus Operator's: no Kubernetes schema
        assert custom_kind_errors(doc.obj) == [], doc.id
        return
    try:
        kubernetes_validate.validate(doc.obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        pytest.fail(f"{doc.id} is not a valid {doc.kind} for Kubernetes {version}: {path}: {exc.message}")


def test_the_manifests_hold_every_deploy_artifact_the_issue_asks_for() -> None:
    kinds = {(d.kind, d.name) for d in all_docs()}
    for wanted in [
        ("CustomResourceDefinition", "devices.scheduling.koordinator.sh"),
        ("ClusterRole", "fgpu-agent"),
        ("ClusterRole", "fgpu-scheduler"),
        ("DaemonSet", "fgpu-agent"),
        ("Deployment", "fgpu-scheduler"),
        ("ConfigMap", "fgpu-kube-scheduler-config"),
        ("ConfigMap", "fgpu-translation-rules"),
        ("Secret", names.SIGNING_KEY_SECRET),
        ("ConfigMap", names.VERIFYING_KEYS_CONFIGMAP),
        ("ValidatingAdmissionPolicy", "fgpu-scheduler-owns-allocations"),
        ("ValidatingAdmissionPolicyBinding", "fgpu-scheduler-owns-allocations"),
        ("MutatingWebhookConfiguration", "fgpu-webhook"),
        ("ValidatingWebhookConfiguration", "fgpu-webhook"),
        ("Deployment", "fgpu-webhook"),
    ]:
        assert wanted in kinds, f"{wanted[0]}/{wanted[1]} missing from hack/deploy"


def _kube_scheduler_config() -> dict[str, Any]:
    config: dict[str, Any] = embedded_yaml("ConfigMap", "fgpu-kube-scheduler-config", "config.yaml")
    return config


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.removeprefix("http://").rpartition(":")
    return host, int(port)


def test_the_kube_scheduler_configuration_matches_the_v1_schema() -> None:
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft202012Validator(kubescheduler_schema.SCHEMA).iter_errors(_kube_scheduler_config())
    ]
    assert errors == []


def test_the_v1_schema_refuses_a_misspelt_extender_key() -> None:
    config = _kube_scheduler_config()
    config["extenders"][0]["nodeCacheCapabel"] = True
    assert not jsonschema.Draft202012Validator(kubescheduler_schema.SCHEMA).is_valid(config)


def test_the_extender_lives_in_its_own_profile_named_for_the_fgpu_scheduler() -> None:
    config = _kube_scheduler_config()
    assert [p["schedulerName"] for p in config["profiles"]] == [names.SCHEDULER_NAME]
    assert "default-scheduler" not in json.dumps(config["profiles"])


def test_the_default_deployment_is_kube_scheduler_with_fgpu_scheduler_as_its_extender_in_one_pod() -> None:
    deployment = find("Deployment", "fgpu-scheduler")
    assert [c["name"] for c in pod_spec(deployment)["containers"]] == ["kube-scheduler", "scheduler"]
    kube_scheduler = container(deployment, "kube-scheduler")
    config_dir = mount_path_of(deployment, "kube-scheduler", "kube-scheduler-config")
    assert f"--config={config_dir}/config.yaml" in kube_scheduler["command"]
    assert volume(deployment, "kube-scheduler-config")["configMap"]["name"] == "fgpu-kube-scheduler-config"
    fgpu = scheduler_config.from_mapping(embedded_yaml("ConfigMap", "fgpu-scheduler-config", "scheduler.yaml"))
    # kube-scheduler binds through the extender's bind verb; fgpu-scheduler must not bind on its own.
    assert fgpu.standalone is False


def test_the_extender_is_reached_over_loopback_inside_the_pod_with_the_verbs_it_serves() -> None:
    (extender,) = _kube_scheduler_config()["extenders"]
    fgpu = embedded_yaml("ConfigMap", "fgpu-scheduler-config", "scheduler.yaml")
    assert extender["urlPrefix"] == f"http://{fgpu['extenderListen']}"
    assert _host_port(extender["urlPrefix"]) == ("127.0.0.1", 9444)
    assert extender["enableHTTPS"] is False  # loopback only: nothing outside the pod can connect
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == ("filter", "prioritize", "bind")
    # The scheduler answers with NodeNames only when kube-scheduler sends them.
    assert extender["nodeCacheCapable"] is True


@pytest.mark.parametrize("docs", [None, standalone_docs()], ids=["extender-mode", "standalone"])
def test_grpc_and_the_extender_listen_on_loopback_and_only_metrics_face_the_network(docs: tuple[Doc, ...] | None) -> None:
    raw = embedded_yaml("ConfigMap", "fgpu-scheduler-config", "scheduler.yaml", docs=docs)
    assert _host_port(raw["grpcListen"])[0] == "127.0.0.1"
    assert "extenderListen" not in raw or _host_port(raw["extenderListen"])[0] == "127.0.0.1"
    deployment = find("Deployment", "fgpu-scheduler", docs=docs)
    ports = container(deployment, "scheduler")["ports"]
    assert [(p["name"], p["containerPort"]) for p in ports] == [("metrics", _host_port(raw["metricsListen"])[1])]
    for probe in ("readinessProbe", "livenessProbe"):
        # kubelet probes the pod IP: a loopback listener would be out of its reach.
        assert container(deployment, "scheduler")[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}


def test_the_extender_manages_every_resource_fgpu_understands() -> None:
    (extender,) = _kube_scheduler_config()["extenders"]
    managed = {r["name"] for r in extender["managedResources"]}
    wanted = set(names.KOORDINATOR_RESOURCES) | {names.NVIDIA_GPU} | set(TranslationRules.default().resources)
    assert managed == wanted
    assert set(MANAGED_RESOURCES) <= managed
    # fgpu accounts these per GPU; kube-scheduler's per-node sum must not refuse a pod first.
    assert all(r["ignoredByScheduler"] for r in extender["managedResources"])


def _bound_to(account: str, role_kind: str, role_name: str) -> bool:
    bindings = [d.obj for d in all_docs() if d.kind in ("RoleBinding", "ClusterRoleBinding")]
    return any(
        b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role_name}
        and {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE} in b["subjects"]
        for b in bindings
    )


def test_the_pods_one_service_account_holds_kube_schedulers_permissions_too() -> None:
    account = pod_spec(find("Deployment", "fgpu-scheduler"))["serviceAccountName"]
    assert _bound_to(account, "ClusterRole", "fgpu-scheduler")
    assert _bound_to(account, "ClusterRole", "system:kube-scheduler")
    assert _bound_to(account, "ClusterRole", "system:volume-scheduler")
    assert _bound_to(account, "Role", "extension-apiserver-authentication-reader")


def test_the_kube_scheduler_elects_a_leader_on_a_lease_its_role_grants() -> None:
    election = _kube_scheduler_config()["leaderElection"]
    role = find("Role", "fgpu-kube-scheduler-leader-election")
    assert election["resourceNamespace"] == role["metadata"]["namespace"]
    assert any(election["resourceName"] in r.get("resourceNames", []) for r in role["rules"])
    account = pod_spec(find("Deployment", "fgpu-scheduler"))["serviceAccountName"]
    assert _bound_to(account, "Role", "fgpu-kube-scheduler-leader-election")


@pytest.mark.parametrize("docs", [None, standalone_docs()], ids=["extender-mode", "standalone"])
def test_the_scheduler_config_loads_with_the_schedulers_own_loader(docs: tuple[Doc, ...] | None) -> None:
    raw = embedded_yaml("ConfigMap", "fgpu-scheduler-config", "scheduler.yaml", docs=docs)
    config = scheduler_config.from_mapping(raw, where="fgpu-scheduler-config")
    scheduler_config.validate(config)
    assert config.state is scheduler_config.StateBackend.KUBERNETES
    deployment = find("Deployment", "fgpu-scheduler", docs=docs)
    assert config.signing_key.startswith(mount_path_of(deployment, "scheduler", "signing-key") + "/")
    assert config.translation_rules.startswith(mount_path_of(deployment, "scheduler", "rules") + "/")
    assert volume(deployment, "config")["configMap"]["name"] == "fgpu-scheduler-config"


def test_the_standalone_scheduler_elects_a_leader_on_the_lease_its_role_grants() -> None:
    raw = embedded_yaml("ConfigMap", "fgpu-scheduler-config", "scheduler.yaml", docs=standalone_docs())
    config = scheduler_config.from_mapping(raw)
    assert config.standalone and config.leader_election.enabled
    deployment = find("Deployment", "fgpu-scheduler", docs=standalone_docs())
    assert deployment["spec"]["replicas"] >= 2
    assert [c["name"] for c in pod_spec(deployment)["containers"]] == ["scheduler"]
    role = find("Role", "fgpu-scheduler-leader-election")
    assert role["metadata"]["namespace"] == config.leader_election.namespace
    granted = {verb for r in role["rules"] if config.leader_election.lease_name in r.get("resourceNames", []) for verb in r["verbs"]}
    assert {"get", "update"} <= granted
    assert any(r.get("verbs") == ["create"] and not r.get("resourceNames") for r in role["rules"])


def test_extender_mode_runs_one_scheduler_pod_whose_rollout_never_overlaps() -> None:
    deployment = find("Deployment", "fgpu-scheduler")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_standalone_replaces_exactly_the_scheduler_config_and_deployment_by_name() -> None:
    assert {(d.kind, d.namespace, d.name) for d in standalone_docs()} == {
        ("ConfigMap", NAMESPACE, "fgpu-scheduler-config"),
        ("Deployment", NAMESPACE, "fgpu-scheduler"),
    }
    base = {(d.kind, d.namespace, d.name) for d in base_docs()}
    assert all((d.kind, d.namespace, d.name) in base for d in standalone_docs())


def test_the_agent_config_loads_with_the_agents_own_loader_and_its_paths_are_mounted() -> None:
    config = parse_config(embedded_yaml("ConfigMap", "fgpu-agent-config", "agent.yaml"), source="fgpu-agent-config")
    agent = find("DaemonSet", "fgpu-agent")
    hook_socket = config.hook_listen.removeprefix("unix://")
    assert Path(hook_socket).parent.as_posix() == mount_path_of(agent, "agent", "run-fgpu-agent")
    assert volume(agent, "run-fgpu-agent")["hostPath"] == {"path": "/var/run/fgpu-agent", "type": "DirectoryOrCreate"}
    assert config.proc_root == mount_path_of(agent, "agent", "host-proc")
    assert volume(agent, "host-proc")["hostPath"]["path"] == "/proc"
    checkpoint_dir = mount_path_of(agent, "agent", "device-plugins")
    assert Path(config.checkpoint_path).parent.as_posix() == checkpoint_dir
    assert volume(agent, "device-plugins")["hostPath"]["path"] == checkpoint_dir
    assert config.verifying_keys == mount_path_of(agent, "agent", "verifying-keys")
    assert volume(agent, "verifying-keys")["configMap"]["name"] == names.VERIFYING_KEYS_CONFIGMAP
    assert config.legacy_signing_key.startswith(mount_path_of(agent, "agent", "legacy-signing-key") + "/")
    legacy = volume(agent, "legacy-signing-key")["secret"]
    assert (legacy["secretName"], legacy["optional"]) == (names.LEGACY_SIGNING_KEY_SECRET, True)
    # The agent creates these on the host for GPU containers, so it sees them at their host path.
    for name, path in (("hami-cache", config.isolation_paths.hami_cache_root), ("hami-lock", config.isolation_paths.hami_lock_dir)):
        assert mount_path_of(agent, "agent", name) == path == volume(agent, name)["hostPath"]["path"]


def test_hami_core_lands_where_the_agent_config_looks_for_it_and_the_agent_sees_it_read_only() -> None:
    config = parse_config(embedded_yaml("ConfigMap", "fgpu-agent-config", "agent.yaml"), source="fgpu-agent-config")
    agent = find("DaemonSet", "fgpu-agent")
    (init,) = pod_spec(agent)["initContainers"]
    image, _, digest = init["image"].partition("@")
    assert image.rsplit(":", 1)[1].startswith("v") and digest.startswith("sha256:") and len(digest) == 71
    script = init["command"][-1]
    assert f"lib={config.isolation_paths.hami_library}" in script
    assert f"preload={config.isolation_paths.hami_preload}" in script
    # The preload file names the library where the hook mounts it in GPU containers.
    assert f'"{config.isolation_paths.hami_container_dir}/libvgpu.so"' in script
    library_dir = Path(config.isolation_paths.hami_library).parent.as_posix()
    assert volume(agent, "hami-library-dir")["hostPath"]["path"] == library_dir
    assert {m["name"]: m["mountPath"] for m in init["volumeMounts"]}["hami-library-dir"] == library_dir
    (seen,) = [m for m in container(agent, "agent")["volumeMounts"] if m["name"] == "hami-library-dir"]
    assert (seen["mountPath"], seen["readOnly"]) == (library_dir, True)


def test_the_webhook_overlay_gets_its_certificate_from_cert_manager() -> None:
    docs = webhook_docs()
    certificate = find("Certificate", "fgpu-webhook", docs=docs)
    deployment = find("Deployment", "fgpu-webhook", docs=docs)
    assert volume(deployment, "tls")["secret"]["secretName"] == certificate["spec"]["secretName"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotations = find(kind, "fgpu-webhook", docs=docs)["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/fgpu-webhook"


def _on_host(path: str) -> Path:
    """A host path with /var/run spelt /run (the one is a link to the other)."""
    p = Path(path.removeprefix("unix://"))
    return Path("/run") / p.relative_to("/var/run") if p.is_relative_to("/var/run") else p


def test_the_agent_cannot_reach_the_proxys_cri_or_admin_socket() -> None:
    """The proxy's sockets sit in /var/run/fgpu; the agent mounts only its own /var/run/fgpu-agent."""
    agent = find("DaemonSet", "fgpu-agent")
    proxy = ProxyConfig()
    proxy_sockets = {_on_host(proxy.listen), _on_host(proxy.admin_listen)}
    assert {s.parent for s in proxy_sockets} == {Path("/run/fgpu")}
    for vol in pod_spec(agent)["volumes"]:
        if "hostPath" in vol:
            mounted = _on_host(vol["hostPath"]["path"])
            # neither the socket's directory nor any directory above it (/run, /var, /)
            assert not any(mounted in s.parents for s in proxy_sockets), f"{vol['name']} exposes {proxy_sockets}"
    config = parse_config(embedded_yaml("ConfigMap", "fgpu-agent-config", "agent.yaml"), source="fgpu-agent-config")
    assert _on_host(config.hook_listen).parent == Path("/run/fgpu-agent")


def test_the_agent_runs_on_the_host_network_so_it_never_waits_for_the_cni() -> None:
    agent = find("DaemonSet", "fgpu-agent")
    spec = pod_spec(agent)
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    config = parse_config(embedded_yaml("ConfigMap", "fgpu-agent-config", "agent.yaml"), source="fgpu-agent-config")
    # The metrics port is a host port now: the container port and the probe must match what the agent binds.
    _host, _, port = config.metrics_listen.rpartition(":")
    ports = {p["name"]: p for p in container(agent, "agent")["ports"]}
    assert ports["metrics"]["containerPort"] == int(port)
    assert "hostPort" not in ports["metrics"] or ports["metrics"]["hostPort"] == int(port)
    assert container(agent, "agent")["livenessProbe"]["httpGet"]["port"] == "metrics"
    # Bound on every address, so kubelet's probe at the node IP reaches it.
    assert _host in ("", "0.0.0.0")


def test_the_agent_gets_its_node_name_from_the_downward_api() -> None:
    env = {e["name"]: e for e in container(find("DaemonSet", "fgpu-agent"), "agent")["env"]}
    assert env[names.NODE_NAME_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_the_agent_pod_is_a_hook_server_in_a_namespace_the_proxy_trusts() -> None:
    agent = find("DaemonSet", "fgpu-agent")
    assert agent["spec"]["template"]["metadata"]["labels"][names.HOOK_SERVER_LABEL] == "true"
    assert agent["metadata"]["namespace"] in ProxyConfig().hook_server_namespaces


def test_the_translation_rules_configmap_is_the_built_in_rules() -> None:
    shipped = find("ConfigMap", "fgpu-translation-rules")["data"]["rules.yaml"]
    built_in = (REPO / "apis" / "rules" / "default.yaml").read_text()
    assert shipped == built_in, "run hack/deploy/update-rules-configmap.sh"
    assert TranslationRules.from_yaml(shipped).resources == TranslationRules.default().resources


def _roles() -> list[Doc]:
    return [d for d in all_docs() if d.kind in ("Role", "ClusterRole")]


@pytest.mark.parametrize("role", _roles(), ids=lambda d: d.id)
def test_no_role_grants_wildcards_deletes_or_secrets(role: Doc) -> None:
    for rule in role.obj["rules"]:
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule.get(key, []), f"{role.id}: wildcard in {key}"
        assert not {"delete", "deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"])
        assert "secrets" not in rule["resources"]


def test_the_scheduler_may_bind_pods_but_not_create_update_or_patch_them() -> None:
    # The allocation annotations travel inside the Binding, so the scheduler needs no pod patch.
    rules = find("ClusterRole", "fgpu-scheduler")["rules"]
    verbs = {res: set(r["verbs"]) for r in rules for res in r["resources"]}
    assert verbs["pods"] == {"get", "list", "watch"}
    assert verbs["pods/binding"] == {"create"}
    assert verbs["devices"] == {"get", "list", "watch"}


def test_the_agent_may_write_devices_and_nodes_post_events_and_only_list_pods() -> None:
    rules = find("ClusterRole", "fgpu-agent")["rules"]
    verbs = {res: set(r["verbs"]) for r in rules for res in r["resources"]}
    assert set(verbs) == {"devices", "nodes", "nodes/status", "pods", "events"}
    assert verbs["pods"] == {"list"}
    # The isolation condition is a status write; Events only created, never read or changed.
    assert verbs["nodes/status"] == {"patch"}
    assert verbs["events"] == {"create"}


def _workloads() -> list[Doc]:
    return [d for d in all_docs() if d.kind in ("Deployment", "DaemonSet")]


@pytest.mark.parametrize("workload", _workloads(), ids=lambda d: d.id)
def test_every_account_config_map_and_secret_a_workload_uses_is_shipped(workload: Doc) -> None:
    shipped = {(d.kind, d.namespace, d.name) for d in all_docs()}
    # cert-manager fills the Secret a Certificate names.
    shipped |= {("Secret", d.namespace, d.obj["spec"]["secretName"]) for d in all_docs() if d.kind == "Certificate"}
    spec = pod_spec(workload.obj)
    assert ("ServiceAccount", workload.namespace, spec["serviceAccountName"]) in shipped
    for vol in spec.get("volumes", []):
        if "configMap" in vol:
            assert ("ConfigMap", workload.namespace, vol["configMap"]["name"]) in shipped
        if "secret" in vol and not vol["secret"].get("optional"):  # an optional one may rightly be absent
            assert ("Secret", workload.namespace, vol["secret"]["secretName"]) in shipped


@pytest.mark.parametrize("workload", _workloads(), ids=lambda d: d.id)
def test_workloads_drop_every_capability_and_keep_the_root_filesystem_read_only(workload: Doc) -> None:
    spec = pod_spec(workload.obj)
    for c in spec["containers"] + spec.get("initContainers", []):
        security = c["securityContext"]
        assert security["capabilities"]["drop"] == ["ALL"] and not security["capabilities"].get("add")
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False


def test_namespaced_objects_live_in_the_fgpu_namespace() -> None:
    cluster_scoped = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
                      "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                      "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    for doc in all_docs():
        if doc.kind in cluster_scoped:
            assert not doc.namespace, doc.id
        elif doc.name != "fgpu-kube-scheduler-auth-reader":  # kube-scheduler reads auth config from kube-system
            assert doc.namespace == NAMESPACE, doc.id


def test_no_node_mounts_the_private_signing_key() -> None:
    for doc in all_docs():
        if doc.kind == "DaemonSet":
            secrets = {v["secret"]["secretName"] for v in pod_spec(doc.obj).get("volumes", []) if "secret" in v}
            assert names.SIGNING_KEY_SECRET not in secrets, doc.id


def test_the_signing_key_template_carries_no_key() -> None:
    secret = find("Secret", names.SIGNING_KEY_SECRET, docs=all_docs())
    values = list((secret.get("stringData") or {}).values()) + list((secret.get("data") or {}).values())
    assert values == [""]


def test_the_service_and_network_policy_expose_only_the_metrics_port() -> None:
    service = find("Service", "fgpu-scheduler")
    assert [(p["name"], p["targetPort"]) for p in service["spec"]["ports"]] == [("metrics", "metrics")]
    policy = find("NetworkPolicy", "fgpu-scheduler")
    assert [port for rule in policy["spec"]["ingress"] for port in rule["ports"]] == [{"port": "metrics", "protocol": "TCP"}]
    config = embedded_yaml("ConfigMap", "fgpu-scheduler-config", "scheduler.yaml")
    ports = {p["name"]: p["containerPort"] for p in container(find("Deployment", "fgpu-scheduler"), "scheduler")["ports"]}
    assert config["metricsListen"] == f"0.0.0.0:{ports['metrics']}"


def test_the_device_the_agent_prints_fits_the_crd_schema() -> None:
    inventory = REPO / "examples" / "inventories" / "h100-8x-nvlink.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "agent.main", "--fake-nvml", str(inventory), "--node-name", "n1", "--once", "--print", "device"],
        capture_output=True, text=True, timeout=60, check=False, cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    device = json.loads(result.stdout)
    assert validation_errors(device) == []
    assert pruned_paths(device) == []


def test_the_install_guide_names_every_manifest() -> None:
    guide = (REPO / "docs" / "deploy.md").read_text()
    for path in sorted(DEPLOY.rglob("*.yaml")):
        relative = path.relative_to(REPO).as_posix()
        assert relative in guide or f"{path.parent.relative_to(REPO).as_posix()}/" in guide, f"docs/deploy.md: {relative}"
