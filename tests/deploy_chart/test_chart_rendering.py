"""deploy/chart rendered by Helm's engine: valid objects for every supported Kubernetes, working keys and
certificates, one agent per pool, HAMi-core pinned, values that cannot work refused, and hack/deploy/ its
exact rendering."""

from __future__ import annotations

import datetime
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import ExtendedKeyUsageOID

from agent.config import parse_config
from apis import keyfiles, names
from apis.signing import key_id_of
from hack import render_manifests
from tests.deploy_chart import chart
from tests.deploy_chart.chart import (
    NAMESPACE,
    VARIANTS,
    Rendered,
    container,
    one,
    pod_spec,
    render,
    render_error,
)
from tests.deploy_chart.crd_kinds import CUSTOM_KINDS, custom_kind_errors

#: The oldest Kubernetes the chart supports (ValidatingAdmissionPolicy v1), and the newest known.
VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())
HAMI_DIGEST = "sha256:8c45cd84d8df3e6a8fe8c95e0141684973b5015692a0ef87588da05284f34447"


def _variant_docs() -> list[tuple[str, Rendered]]:
    chart.need_helm()
    return [(name, doc) for name, values in VARIANTS.items() for doc in render(values)]


@pytest.fixture(scope="module")
def variants() -> list[tuple[str, Rendered]]:
    return _variant_docs()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_object_validates_against_the_kubernetes_schemas(
    variants: list[tuple[str, Rendered]], variant: str, version: str
) -> None:
    failures = []
    for name, doc in variants:
        if name != variant:
            continue
        if (doc.obj["apiVersion"].split("/")[0], doc.kind) in CUSTOM_KINDS:
            failures += [f"{doc.id}: {e}" for e in custom_kind_errors(doc.obj)]
            continue
        try:
            kubernetes_validate.validate(doc.obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{doc.id}: {'.'.join(map(str, exc.path))}: {exc.message}")
    assert failures == []


def test_the_plain_manifests_are_exactly_the_charts_rendering() -> None:
    chart.need_helm()
    assert render_manifests.differences(render_manifests.render_all()) == [], "run hack/render-manifests.sh"


def test_the_drift_check_names_a_hand_edited_a_missing_and_a_stray_manifest(tmp_path: Path) -> None:
    chart.need_helm()
    deploy = tmp_path / "deploy"
    shutil.copytree(render_manifests.DEPLOY, deploy)
    edited = deploy / "30-agent.yaml"
    edited.write_text(edited.read_text().replace("maxUnavailable: 1", "maxUnavailable: 3"))
    (deploy / "standalone" / "20-scheduler-config.yaml").unlink()
    (deploy / "99-by-hand.yaml").write_text("kind: ConfigMap\n")
    assert render_manifests.differences(render_manifests.render_all(), deploy=deploy) == [
        "hack/deploy/30-agent.yaml: differs from the chart's rendering",
        "hack/deploy/standalone/20-scheduler-config.yaml: missing",
        "hack/deploy/99-by-hand.yaml: not rendered from the chart (stale?)",
    ]


def test_the_render_script_checks_without_writing() -> None:
    chart.need_helm()
    result = subprocess.run(
        ["bash", str(render_manifests.REPO / "hack" / "render-manifests.sh"), "--check"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr


def test_the_charts_crd_is_the_one_the_api_double_installs() -> None:
    from tests.kubeapi.server import DEVICE_CRD

    assert Path(DEVICE_CRD).read_text() == (render_manifests.CHART / "crds" / "device.yaml").read_text()


# --- signing keys -----------------------------------------------------------------------------------


def test_a_generated_signing_key_is_ed25519_and_the_configmap_holds_its_public_key_under_its_key_id() -> None:
    docs = render()
    secret = one(docs, "Secret", names.SIGNING_KEY_SECRET)
    signing = keyfiles.parse_private_key(secret["stringData"]["signing-key.pem"].encode(), where="rendered Secret")
    published = one(docs, "ConfigMap", names.VERIFYING_KEYS_CONFIGMAP)["data"]
    assert list(published) == [f"{signing.key_id}.pub"]
    (public,) = keyfiles.parse_public_keys(published[f"{signing.key_id}.pub"].encode(), where="rendered ConfigMap")
    assert public.key_id == signing.key_id
    assert isinstance(public.key, Ed25519PublicKey)
    message = b"pod-uid/node/allocation"
    public.key.verify(signing.key.sign(message), message)  # raises if the halves do not match
    # Kept on uninstall, so pods signed with it still verify after a reinstall.
    for obj in (secret, one(docs, "ConfigMap", names.VERIFYING_KEYS_CONFIGMAP)):
        assert obj["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_each_render_generates_a_new_key_and_existing_keys_render_no_key_objects() -> None:
    first = one(render(), "Secret", names.SIGNING_KEY_SECRET)["stringData"]["signing-key.pem"]
    second = one(render(), "Secret", names.SIGNING_KEY_SECRET)["stringData"]["signing-key.pem"]
    assert first != second
    kinds = {(d.kind, d.name) for d in render({"signingKeys": {"source": "existing"}})}
    assert ("Secret", names.SIGNING_KEY_SECRET) not in kinds
    assert ("ConfigMap", names.VERIFYING_KEYS_CONFIGMAP) not in kinds


def test_keys_given_as_values_are_rendered_as_given() -> None:
    key = Ed25519PrivateKey.generate()
    pem = keyfiles.private_pem(_signing(key)).decode()
    public = {f"{key_id_of(key.public_key())}.pub": keyfiles.public_pem(_signing(key).public).decode()}
    docs = render({"signingKeys": {"source": "values", "privateKey": pem, "publicKeys": public}})
    assert one(docs, "Secret", names.SIGNING_KEY_SECRET)["stringData"]["signing-key.pem"] == pem
    assert one(docs, "ConfigMap", names.VERIFYING_KEYS_CONFIGMAP)["data"] == public


def _signing(key: Ed25519PrivateKey) -> Any:
    from apis.signing import SigningKey

    return SigningKey.of(key)


# --- the webhook ------------------------------------------------------------------------------------


def _webhooks(docs: list[Rendered]) -> tuple[dict[str, Any], dict[str, Any]]:
    (mutating,) = one(docs, "MutatingWebhookConfiguration", "fgpu-webhook")["webhooks"]
    (validating,) = one(docs, "ValidatingWebhookConfiguration", "fgpu-webhook")["webhooks"]
    return mutating, validating


def test_the_generated_serving_certificate_chains_to_the_ca_bundle_and_names_the_service() -> None:
    import base64

    docs = render()
    tls = one(docs, "Secret", "fgpu-webhook-tls")
    assert tls["type"] == "kubernetes.io/tls"
    cert = x509.load_pem_x509_certificate(base64.b64decode(tls["data"]["tls.crt"]))
    for webhook in _webhooks(docs):
        ca = x509.load_pem_x509_certificate(base64.b64decode(webhook["clientConfig"]["caBundle"]))
        assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        cert.verify_directly_issued_by(ca)  # raises when the bundle did not sign it
    dns = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"fgpu-webhook.{NAMESPACE}.svc" in dns
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usage
    assert cert.not_valid_after_utc > datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=365)


def test_the_mutating_webhook_fails_open_fast_and_the_validating_one_fails_closed_outside_system_namespaces() -> None:
    docs = render()
    mutating, validating = _webhooks(docs)
    assert mutating["failurePolicy"] == "Ignore" and mutating["timeoutSeconds"] <= 5
    assert validating["failurePolicy"] == "Fail"
    for webhook, path in ((mutating, "/mutate"), (validating, "/validate")):
        assert webhook["clientConfig"]["service"] == {"name": "fgpu-webhook", "namespace": NAMESPACE, "path": path, "port": 443}
        assert webhook["sideEffects"] == "None"  # dry-run requests reach it
        assert webhook["admissionReviewVersions"] == ["v1"]
        assert webhook["rules"] == [
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}
        ]
        (excluded,) = webhook["namespaceSelector"]["matchExpressions"]
        assert excluded == {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NAMESPACE]}
    service = one(docs, "Service", "fgpu-webhook")
    deployment = one(docs, "Deployment", "fgpu-webhook")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    (port,) = service["spec"]["ports"]
    webhook_port = container(deployment, "webhook")["ports"][0]
    assert port["targetPort"] == webhook_port["name"]


def test_the_charts_webhooks_carry_the_documented_match_conditions_and_reinvocation() -> None:
    # docs/webhook.md's block is the one tests/webhook/test_recommended_configuration.py evaluates
    # with CEL against the webhook's own decisions; the chart must deploy exactly those conditions.
    from tests.webhook.test_recommended_configuration import MUTATING, VALIDATING

    mutating, validating = _webhooks(render())

    assert mutating["matchConditions"] == MUTATING["matchConditions"]
    assert validating["matchConditions"] == VALIDATING["matchConditions"]
    assert mutating["reinvocationPolicy"] == MUTATING["reinvocationPolicy"] == "IfNeeded"
    deployment = one(render(), "Deployment", "fgpu-webhook")
    assert container(deployment, "webhook")["lifecycle"]["preStop"]["sleep"]["seconds"] > 0


def test_the_webhook_runs_fgpu_webhook_with_kubernetes_flag_names_on_the_mounted_certificate() -> None:
    deployment = one(render(), "Deployment", "fgpu-webhook")
    webhook = container(deployment, "webhook")
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in webhook["command"][1:])
    assert webhook["command"][0] == "fgpu-webhook"
    assert set(flags) == {"listen", "tls-cert-file", "tls-private-key-file", "config"}
    (mount,) = [m for m in webhook["volumeMounts"] if m["name"] == "tls"]
    assert flags["tls-cert-file"] == f"{mount['mountPath']}/tls.crt"
    assert flags["tls-private-key-file"] == f"{mount['mountPath']}/tls.key"
    assert flags["listen"].endswith(f":{webhook['ports'][0]['containerPort']}")
    assert [v["secret"]["secretName"] for v in pod_spec(deployment)["volumes"] if v["name"] == "tls"] == ["fgpu-webhook-tls"]
    assert webhook["readinessProbe"]["httpGet"]["path"] == "/healthz"


def test_the_webhook_reads_the_schedulers_translation_rules_and_the_injection_scope_with_its_own_loader() -> None:
    from webhook import config as webhook_config

    scope = {"namespaces": ["ml"], "podSelector": {"matchLabels": {"team": "ml"}}}
    docs = render({"webhook": {"schedulerInjection": scope}})
    deployment = one(docs, "Deployment", "fgpu-webhook")
    webhook = container(deployment, "webhook")
    mounts = {m["name"]: m["mountPath"] for m in webhook["volumeMounts"]}
    flag = next(a for a in webhook["command"] if a.startswith("--config="))
    assert flag == f"--config={mounts['config']}/webhook.yaml"
    raw = yaml.safe_load(one(docs, "ConfigMap", "fgpu-webhook-config")["data"]["webhook.yaml"])
    loaded = webhook_config.from_mapping(raw, origin="fgpu-webhook-config")
    assert loaded.translation_rules == f"{mounts['rules']}/rules.yaml"
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    assert volumes["rules"]["configMap"]["name"] == "fgpu-translation-rules"
    assert raw["schedulerInjection"] == scope
    assert webhook["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_with_cert_manager_a_certificate_fills_the_secret_and_cainjector_the_ca_bundle() -> None:
    docs = render({"webhook": {"tls": {"source": "certManager"}}})
    certificate = one(docs, "Certificate", "fgpu-webhook")
    assert certificate["spec"]["secretName"] == "fgpu-webhook-tls"
    assert f"fgpu-webhook.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    assert certificate["spec"]["issuerRef"] == {"name": "fgpu-webhook-selfsigned", "kind": "Issuer"}
    assert one(docs, "Issuer", "fgpu-webhook-selfsigned")["spec"] == {"selfSigned": {}}
    assert not [d for d in docs if d.kind == "Secret" and d.name == "fgpu-webhook-tls"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = one(docs, kind, "fgpu-webhook")
        assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/fgpu-webhook"
        assert "caBundle" not in config["webhooks"][0]["clientConfig"]


def test_the_webhook_can_be_left_out() -> None:
    kinds = {d.kind for d in render({"webhook": {"enabled": False}})}
    assert not kinds & {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    assert "fgpu-webhook" not in {d.name for d in render({"webhook": {"enabled": False}})}


# --- agents, pools and HAMi-core ------------------------------------------------------------------------


def test_each_pool_gets_its_own_agent_daemonset_and_config_with_its_backend_and_nodes() -> None:
    docs = render(VARIANTS["pools-and-own-keys"])
    expected = {"shared": ("", "hami-core"), "inference": ("-inference", "mps"), "trusted": ("-trusted", "none")}
    daemonsets = {d.name for d in docs if d.kind == "DaemonSet"}
    assert daemonsets == {f"fgpu-agent{suffix}" for suffix, _ in expected.values()}
    selectors = []
    for pool, (suffix, isolation) in expected.items():
        daemonset = one(docs, "DaemonSet", f"fgpu-agent{suffix}")
        spec = pod_spec(daemonset)
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true", "fgpu.io/pool": pool}
        (config_volume,) = [v for v in spec["volumes"] if v["name"] == "config"]
        config_map = one(docs, "ConfigMap", config_volume["configMap"]["name"])
        assert config_map["metadata"]["name"] == f"fgpu-agent-config{suffix}"
        config = parse_config(yaml.safe_load(config_map["data"]["agent.yaml"]), source=config_map["metadata"]["name"])
        assert config.isolation == isolation
        init = [c["name"] for c in spec.get("initContainers", [])]
        assert init == (["install-hami-core"] if isolation == "hami-core" else [])
        mounts = {m["name"]: m["mountPath"] for m in container(daemonset, "agent")["volumeMounts"]}
        if isolation == "mps":
            assert mounts["mps-pipe-dir"] == config.isolation_paths.mps_pipe_dir
        if isolation == "hami-core":
            assert mounts["hami-library-dir"] == str(Path(config.isolation_paths.hami_library).parent)
        selectors.append(daemonset["spec"]["selector"]["matchLabels"])
        assert daemonset["spec"]["template"]["metadata"]["labels"][names.HOOK_SERVER_LABEL] == "true"
    # No DaemonSet's selector matches another pool's pods.
    pods = [one(docs, "DaemonSet", f"fgpu-agent{s}")["spec"]["template"]["metadata"]["labels"] for s, _ in expected.values()]
    for selector in selectors:
        assert sum(all(labels.get(k) == v for k, v in selector.items()) for labels in pods) == 1


def test_the_default_pool_keeps_the_agent_daemonsets_selector_an_upgrade_cannot_change() -> None:
    daemonset = one(render(), "DaemonSet", "fgpu-agent")
    assert daemonset["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/name": "fgpu-agent"}}


def test_the_hami_core_init_container_is_pinned_by_version_and_digest_and_fills_the_configured_paths() -> None:
    docs = render()
    daemonset = one(docs, "DaemonSet", "fgpu-agent")
    init = container(daemonset, "install-hami-core", init=True)
    assert init["image"] == f"docker.io/projecthami/hami:v2.10.0@{HAMI_DIGEST}"
    config = parse_config(yaml.safe_load(one(docs, "ConfigMap", "fgpu-agent-config")["data"]["agent.yaml"]))
    script = init["command"][-1]
    assert "src=/k8s-vgpu/lib/nvidia/libvgpu.so.v2.10.0" in script
    assert f"lib={config.isolation_paths.hami_library}" in script
    assert f"preload={config.isolation_paths.hami_preload}" in script
    mount = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert mount["hami-library-dir"] == str(Path(config.isolation_paths.hami_library).parent)
    (volume,) = [v for v in pod_spec(daemonset)["volumes"] if v["name"] == "hami-library-dir"]
    assert volume["hostPath"]["path"] == mount["hami-library-dir"]


def test_the_init_script_installs_the_library_by_rename_only_when_it_changed_and_writes_the_preload_file(
    tmp_path: Path,
) -> None:
    image = tmp_path / "image"
    host = tmp_path / "host" / "vgpu"
    (image).mkdir()
    host.mkdir(parents=True)
    source = image / "libvgpu.so.v2.10.0"
    source.write_bytes(b"\x7fELF library v1")
    values = {
        "hamiCore": {"sourcePath": str(source)},
        "agent": {"isolationPaths": {"hamiLibrary": str(host / "libvgpu.so"), "hamiPreload": str(host / "ld.so.preload")}},
    }
    script = container(one(render(values), "DaemonSet", "fgpu-agent"), "install-hami-core", init=True)["command"]

    def run() -> str:
        result = subprocess.run(script, capture_output=True, text=True, timeout=30, check=True)
        return result.stdout

    assert "installed" in run()
    library = host / "libvgpu.so"
    assert library.read_bytes() == source.read_bytes()
    assert (host / "ld.so.preload").read_text() == "/usr/local/vgpu/libvgpu.so\n"
    inode = library.stat().st_ino
    assert run() == ""  # unchanged: left alone
    assert library.stat().st_ino == inode
    source.write_bytes(b"\x7fELF library v2")
    assert "installed" in run()
    assert library.read_bytes() == b"\x7fELF library v2"
    assert library.stat().st_ino != inode  # a new file: running containers keep the one they mapped
    assert sorted(p.name for p in host.iterdir()) == ["ld.so.preload", "libvgpu.so"]


def test_the_agent_may_post_events_and_patch_its_node_status_for_the_isolation_condition() -> None:
    rules = one(render(), "ClusterRole", "fgpu-agent")["rules"]
    verbs = {res: set(r["verbs"]) for r in rules for res in r["resources"]}
    assert "patch" in verbs["nodes/status"]
    assert verbs["events"] == {"create"}


# --- metrics --------------------------------------------------------------------------------------------


def test_service_monitors_scrape_the_scheduler_and_every_pools_agents() -> None:
    values = {**VARIANTS["pools-and-own-keys"], "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}}
    docs = render(values)
    agents = one(docs, "ServiceMonitor", "fgpu-agent")
    service = one(docs, "Service", "fgpu-agent-metrics")
    assert all(service["metadata"]["labels"].get(k) == v for k, v in agents["spec"]["selector"]["matchLabels"].items())
    assert agents["metadata"]["labels"]["release"] == "prom"
    for daemonset in (d.obj for d in docs if d.kind == "DaemonSet"):
        labels = daemonset["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items()), daemonset["metadata"]["name"]
    scheduler = one(docs, "ServiceMonitor", "fgpu-scheduler")
    scheduler_service = one(docs, "Service", "fgpu-scheduler")
    assert all(scheduler_service["metadata"]["labels"].get(k) == v for k, v in scheduler["spec"]["selector"]["matchLabels"].items())
    assert [e["port"] for e in scheduler["spec"]["endpoints"]] == ["metrics"]
    assert not [d for d in render() if d.kind == "ServiceMonitor"]


# --- refusals -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"mode": "kube-scheduler"}, 'mode="kube-scheduler": use extender'),
        ({"agent": {"pools": []}}, "agent.pools is empty"),
        ({"agent": {"pools": [{"name": "default", "isolation": "vgpu"}]}}, 'isolation="vgpu": use hami-core, mps or none'),
        (
            {"agent": {"pools": [{"name": "a", "isolation": "mps", "nodeSelector": {"p": "a"}}, {"name": "b", "isolation": "none"}]}},
            "agent.pools[b] has no nodeSelector",
        ),
        (
            {"agent": {"pools": [{"name": "a", "isolation": "mps", "nodeSelector": {"p": "a"}},
                                 {"name": "b", "isolation": "none", "nodeSelector": {"p": "a"}}]}},
            "agent.pools[b] has the nodeSelector of pool a",
        ),
        ({"hamiCore": {"image": {"digest": ""}}}, "hamiCore.image.digest is empty"),
        ({"signingKeys": {"source": "vault"}}, 'signingKeys.source="vault"'),
        ({"webhook": {"tls": {"source": "existing"}}}, "needs webhook.tls.caBundle"),
    ],
    ids=["mode", "no-pools", "isolation", "pool-without-selector", "same-selector", "hami-digest", "key-source", "tls-bundle"],
)
def test_values_that_cannot_work_are_refused_with_the_fix(values: dict[str, Any], message: str) -> None:
    assert message in render_error(values)


@pytest.mark.parametrize("kube_version", ["v1.30.0", f"v{VERSIONS[-1]}"])
def test_helm_lint_finds_nothing_in_strict_mode(kube_version: str) -> None:
    chart.need_helm()
    import helm_python

    report = helm_python.lint(str(render_manifests.CHART), strict=True, namespace=NAMESPACE, kube_version=kube_version)
    assert [m for m in report["messages"] if m["severity"] >= 2] == [] and report["errors"] == []


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"agent": {"afinity": {}}}, "afinity"),
        ({"webhook": {"schedulerInjection": {"exclude": []}}}, "exclude"),
        ({"schedular": {"replicas": 2}}, "schedular"),
    ],
)
def test_a_misspelt_value_is_refused_naming_the_key(values: dict[str, Any], named: str) -> None:
    # values.schema.json: a key the chart does not know would otherwise be ignored without a word
    assert named in render_error(values)


def test_a_runtime_socket_is_every_pools_ledger_fallback_and_is_off_by_default() -> None:
    socket_path = VARIANTS["pools-and-own-keys"]["agent"]["runtimeSocket"]
    for values, expected in ((VARIANTS["pools-and-own-keys"], f"unix://{socket_path}"), ({}, "")):
        for daemonset in (d.obj for d in render(values) if d.kind == "DaemonSet" and d.name.startswith("fgpu-agent")):
            spec = pod_spec(daemonset)
            (config_volume,) = [v for v in spec["volumes"] if v["name"] == "config"]
            config_map = one(render(values), "ConfigMap", config_volume["configMap"]["name"])
            config = parse_config(yaml.safe_load(config_map["data"]["agent.yaml"]), source=config_map["metadata"]["name"])
            assert config.runtime_endpoint == expected
            sockets = [v for v in spec["volumes"] if v["name"] == "runtime-socket"]
            mounts = [m for m in container(daemonset, "agent")["volumeMounts"] if m["name"] == "runtime-socket"]
            if expected:
                assert sockets == [{"name": "runtime-socket", "hostPath": {"path": socket_path, "type": "Socket"}}]
                assert [m["mountPath"] for m in mounts] == [socket_path]
            else:
                assert sockets == [] and mounts == []


def test_a_relative_runtime_socket_is_refused_naming_the_value() -> None:
    message = render_error({"agent": {"runtimeSocket": "run/containerd.sock"}})
    assert "runtimeSocket" in message
