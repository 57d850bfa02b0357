"""Done when: from an empty (simulated) cluster, applying the rendered chart creates every object the daemons need.

Each install variant is rendered by Helm's engine and created object by object in the Kubernetes API double
through the official client's DynamicClient (discovery, then the REST call per kind, as kubectl and Helm do),
in Helm's install order. Then, reading everything back from the API as kubelet would, every reference
resolves: service accounts, mounted ConfigMaps and Secrets and the very keys the configs name, RBAC role
refs and subjects, policy bindings, Services and webhook Services. The configs are loaded by each
component's own loader from those mounted files, and the keys are checked to work together: the
scheduler's signing key verifies on every agent.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml
from cryptography import x509
from kubernetes import config as kube_config
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError

from agent.config import parse_config
from apis import keyfiles, names
from scheduler_plugin import config as scheduler_config
from tests.deploy_chart.chart import NAMESPACE, VARIANTS, Rendered, pod_spec, render
from tests.kubeapi import store as double_store
from tests.kubeapi.resources import ResourceInfo
from tests.kubeapi.server import DEVICE_CRD, KubeAPIServer

_META = frozenset({"metadata.name", "metadata.namespace"})


def _builtin(group: str, version: str, plural: str, kind: str, *, namespaced: bool) -> ResourceInfo:
    return ResourceInfo(group=group, version=version, plural=plural, singular=kind.lower(), kind=kind,
                        namespaced=namespaced, field_labels=_META)


#: Built-in kinds the chart creates that the double does not serve by default.
CHART_KINDS = (
    _builtin("", "v1", "secrets", "Secret", namespaced=True),
    _builtin("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True),
    _builtin("", "v1", "services", "Service", namespaced=True),
    _builtin("apps", "v1", "daemonsets", "DaemonSet", namespaced=True),
    _builtin("apps", "v1", "deployments", "Deployment", namespaced=True),
    _builtin("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True),
    _builtin("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", namespaced=True),
    _builtin("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    _builtin("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
    _builtin("rbac.authorization.k8s.io", "v1", "roles", "Role", namespaced=True),
    _builtin("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", namespaced=True),
    _builtin("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy", namespaced=False),
    _builtin("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding",
             namespaced=False),
    _builtin("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration",
             namespaced=False),
    _builtin("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration",
             namespaced=False),
)

#: Helm's install order (pkg/release/util/kind_sorter.go), for the kinds the chart renders.
INSTALL_ORDER = (
    "Namespace", "NetworkPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret", "ConfigMap",
    "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service",
    "DaemonSet", "Deployment", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
)
#: kube-scheduler's own roles: the API server makes them (bootstrap policy), no chart does.
SYSTEM_ROLES = {("ClusterRole", "system:kube-scheduler"), ("ClusterRole", "system:volume-scheduler"),
                ("Role", "extension-apiserver-authentication-reader")}


def _crd(group: str, kind: str, plural: str) -> dict[str, Any]:
    """A CRD without a schema (everything kept): what cert-manager or the Prometheus Operator would install."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "versions": [{"name": "v1", "served": True, "storage": True,
                          "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
        },
    }


@pytest.fixture
def cluster(kube_api: KubeAPIServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeAPIServer]:
    served = {(r.group, r.plural) for r in double_store.BUILTIN}
    extra = tuple(k for k in CHART_KINDS if (k.group, k.plural) not in served)
    monkeypatch.setattr(double_store, "BUILTIN", (*double_store.BUILTIN, *extra))
    yield kube_api


class Cluster:
    """The double through the official client, looked up as kubectl does (discovery, then REST)."""

    def __init__(self, server: KubeAPIServer) -> None:
        self.dynamic = DynamicClient(kube_config.new_client_from_config(config_file=server.kubeconfig_path))

    def create(self, obj: Mapping[str, Any]) -> None:
        resource = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        namespace = obj["metadata"].get("namespace") if resource.namespaced else None
        resource.create(body=dict(obj), namespace=namespace)

    def get(self, kind: str, name: str, *, namespace: str = "", api_version: str = "v1") -> dict[str, Any] | None:
        resource = self.dynamic.resources.get(api_version=api_version, kind=kind)
        try:
            found = resource.get(name=name, namespace=namespace or None)
        except NotFoundError:
            return None
        result: dict[str, Any] = found.to_dict()
        return result

    def items(self, api_version: str, kind: str) -> list[dict[str, Any]]:
        resource = self.dynamic.resources.get(api_version=api_version, kind=kind)
        return [dict(i) for i in resource.get().to_dict()["items"]]


def _install(server: KubeAPIServer, docs: list[Rendered], *, create_namespace: bool) -> Cluster:
    """`helm install -n fgpu-system [--create-namespace]` of `docs` into the empty double."""
    server.install_crd(DEVICE_CRD)  # the chart's crds/ directory, which Helm installs first
    kinds = {d.kind for d in docs}
    if kinds & {"Certificate", "Issuer"}:
        server.install_crd(_crd("cert-manager.io", "Certificate", "certificates"))
        server.install_crd(_crd("cert-manager.io", "Issuer", "issuers"))
    if "ServiceMonitor" in kinds:
        server.install_crd(_crd("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"))
    cluster = Cluster(server)
    if create_namespace:
        cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    order = {kind: i for i, kind in enumerate(INSTALL_ORDER)}
    for doc in sorted(docs, key=lambda d: order.get(d.kind, len(order))):
        cluster.create(doc.obj)
    return cluster


class Kubelet:
    """Resolves a file path inside a container to the bytes kubelet would put there, from the API."""

    def __init__(self, cluster: Cluster, workload: Mapping[str, Any], namespace: str) -> None:
        self._cluster = cluster
        self._spec = pod_spec(workload)
        self._namespace = namespace

    def read(self, container: str, path: str) -> bytes:
        (c,) = [c for c in self._spec["containers"] + self._spec.get("initContainers", []) if c["name"] == container]
        target = PurePosixPath(path)
        for mount in c.get("volumeMounts", []):
            root = PurePosixPath(mount["mountPath"])
            if target.is_relative_to(root) and target != root:
                key = target.relative_to(root).as_posix()
                return self._volume_file(mount["name"], key)
        raise AssertionError(f"{path}: no volume of container {container} holds it")

    def keys(self, volume_name: str) -> dict[str, bytes]:
        (volume,) = [v for v in self._spec["volumes"] if v["name"] == volume_name]
        if "configMap" in volume:
            obj = self._cluster.get("ConfigMap", volume["configMap"]["name"], namespace=self._namespace)
            assert obj is not None, f"ConfigMap {volume['configMap']['name']} is missing"
            return {k: v.encode() for k, v in (obj.get("data") or {}).items()}
        if "secret" in volume:
            obj = self._cluster.get("Secret", volume["secret"]["secretName"], namespace=self._namespace)
            assert obj is not None, f"Secret {volume['secret']['secretName']} is missing"
            data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
            return data | {k: v.encode() for k, v in (obj.get("stringData") or {}).items()}
        raise AssertionError(f"volume {volume_name} is no ConfigMap or Secret")

    def _volume_file(self, volume_name: str, key: str) -> bytes:
        files = self.keys(volume_name)
        assert key in files, f"volume {volume_name} has no {key} (it has {sorted(files)})"
        return files[key]


def _workloads(cluster: Cluster) -> list[dict[str, Any]]:
    return cluster.items("apps/v1", "DaemonSet") + cluster.items("apps/v1", "Deployment")


INSTALLS = {
    # helm install fgpu deploy/chart -n fgpu-system --create-namespace: nothing else, nothing by hand.
    "helm-install-defaults": (VARIANTS["defaults"], True),
    "helm-install-standalone": (VARIANTS["standalone"], True),
    "chart-makes-namespace-with-cert-manager-and-prometheus": (VARIANTS["cert-manager-and-service-monitors"], False),
}


@pytest.mark.parametrize("install", sorted(INSTALLS))
def test_applying_the_rendered_chart_to_an_empty_cluster_creates_everything_the_daemons_need(
    cluster: KubeAPIServer, install: str
) -> None:
    values, create_namespace = INSTALLS[install]
    api = _install(cluster, render(values), create_namespace=create_namespace)
    certificates = {c["spec"]["secretName"] for c in _custom(api, "cert-manager.io/v1", "Certificate")}
    for workload in _workloads(api):
        where = f"{workload['kind']}/{workload['metadata']['name']}"
        namespace = workload["metadata"]["namespace"]
        spec = pod_spec(workload)
        assert api.get("ServiceAccount", spec["serviceAccountName"], namespace=namespace), where
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert api.get("ConfigMap", volume["configMap"]["name"], namespace=namespace), f"{where}: {volume}"
            if "secret" in volume and not volume["secret"].get("optional"):
                name = volume["secret"]["secretName"]
                # A Secret cert-manager fills from a Certificate counts once that Certificate exists.
                assert api.get("Secret", name, namespace=namespace) or name in certificates, f"{where}: Secret {name}"
    _check_rbac(api)
    _check_policy_bindings(api)
    _check_services(api)
    _check_webhooks(api, certificates)


def test_the_scheduler_and_every_agent_load_their_configs_and_keys_from_what_was_applied(cluster: KubeAPIServer) -> None:
    values = VARIANTS["pools-and-own-keys"] | {"signingKeys": {"source": "generate"}}
    api = _install(cluster, render(values), create_namespace=True)
    scheduler = api.get("Deployment", "fgpu-scheduler", namespace=NAMESPACE, api_version="apps/v1")
    assert scheduler is not None
    kubelet = Kubelet(api, scheduler, NAMESPACE)
    (command,) = [c["command"] for c in pod_spec(scheduler)["containers"] if c["name"] == "scheduler"]
    raw = yaml.safe_load(kubelet.read("scheduler", command[command.index("--config") + 1]))
    loaded = scheduler_config.from_mapping(raw, where="fgpu-scheduler-config")
    scheduler_config.validate(loaded)
    signing = keyfiles.parse_private_key(kubelet.read("scheduler", loaded.signing_key), where=loaded.signing_key)
    kubelet.read("scheduler", loaded.translation_rules)
    kube_scheduler_args = next(c for c in pod_spec(scheduler)["containers"] if c["name"] == "kube-scheduler")["command"]
    config_flag = next(a for a in kube_scheduler_args if a.startswith("--config="))
    assert yaml.safe_load(kubelet.read("kube-scheduler", config_flag.removeprefix("--config=")))["profiles"]
    daemonsets = api.items("apps/v1", "DaemonSet")
    assert len(daemonsets) == 3
    for daemonset in daemonsets:
        node_kubelet = Kubelet(api, daemonset, NAMESPACE)
        (agent,) = [c for c in pod_spec(daemonset)["containers"] if c["name"] == "agent"]
        agent_config = parse_config(yaml.safe_load(node_kubelet.read("agent", agent["command"][-1])))
        mount = next(m for m in agent["volumeMounts"] if m["mountPath"] == agent_config.verifying_keys)
        public = [
            key for name, pem in node_kubelet.keys(mount["name"]).items() if name.endswith(".pub")
            for key in keyfiles.parse_public_keys(pem, where=name)
        ]
        assert signing.key_id in {k.key_id for k in public}, daemonset["metadata"]["name"]
    assert names.VERIFYING_KEYS_CONFIGMAP == "fgpu-verifying-keys"


def _custom(api: Cluster, api_version: str, kind: str) -> list[dict[str, Any]]:
    try:
        return api.items(api_version, kind)
    except Exception:  # the kind is not served: nothing of it was rendered
        return []


def _check_rbac(api: Cluster) -> None:
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", None)):
        for binding in api.items("rbac.authorization.k8s.io/v1", kind):
            ref = binding["roleRef"]
            if (ref["kind"], ref["name"]) in SYSTEM_ROLES:
                continue
            assert role_kind in (None, ref["kind"])
            namespace = binding["metadata"].get("namespace", "")
            role = api.get(ref["kind"], ref["name"], namespace=namespace if ref["kind"] == "Role" else "",
                           api_version="rbac.authorization.k8s.io/v1")
            assert role is not None, f"{kind}/{binding['metadata']['name']}: {ref['kind']} {ref['name']} is missing"
            for subject in binding["subjects"]:
                assert api.get("ServiceAccount", subject["name"], namespace=subject["namespace"]), subject


def _check_policy_bindings(api: Cluster) -> None:
    version = "admissionregistration.k8s.io/v1"
    policies = {p["metadata"]["name"] for p in api.items(version, "ValidatingAdmissionPolicy")}
    for binding in api.items(version, "ValidatingAdmissionPolicyBinding"):
        assert binding["spec"]["policyName"] in policies


def _check_services(api: Cluster) -> None:
    pods = [(w["metadata"]["namespace"], w["spec"]["template"]) for w in _workloads(api)]
    for service in api.items("v1", "Service"):
        namespace = service["metadata"]["namespace"]
        selector = service["spec"]["selector"]
        matching = [t for ns, t in pods if ns == namespace and all(t["metadata"]["labels"].get(k) == v for k, v in selector.items())]
        assert matching, f"Service {service['metadata']['name']} selects no pods"
        for port in service["spec"]["ports"]:
            named = {p["name"] for t in matching for c in t["spec"]["containers"] for p in c.get("ports", [])}
            assert port["targetPort"] in named, f"Service {service['metadata']['name']}: port {port['targetPort']}"


def _check_webhooks(api: Cluster, certificates: set[str]) -> None:
    version = "admissionregistration.k8s.io/v1"
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for config in api.items(version, kind):
            for webhook in config["webhooks"]:
                ref = webhook["clientConfig"]["service"]
                service = api.get("Service", ref["name"], namespace=ref["namespace"])
                assert service is not None and ref["port"] in [p["port"] for p in service["spec"]["ports"]]
                deployment = api.get("Deployment", ref["name"], namespace=ref["namespace"], api_version="apps/v1")
                assert deployment is not None
                (tls,) = [v["secret"]["secretName"] for v in pod_spec(deployment)["volumes"] if v["name"] == "tls"]
                if "caBundle" in webhook["clientConfig"]:
                    secret = Kubelet(api, deployment, ref["namespace"]).keys("tls")
                    ca = x509.load_pem_x509_certificate(base64.b64decode(webhook["clientConfig"]["caBundle"]))
                    x509.load_pem_x509_certificate(secret["tls.crt"]).verify_directly_issued_by(ca)
                else:
                    injected = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
                    namespace, name = injected.split("/")
                    certificate = api.get("Certificate", name, namespace=namespace, api_version="cert-manager.io/v1")
                    assert certificate is not None and certificate["spec"]["secretName"] == tls in certificates
