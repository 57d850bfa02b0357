"""deploy/chart rendered with Helm's own template engine, for the tests in this folder.

The engine is Helm v4's Go SDK through the helm-python-sdk package (libhelm_c, loaded
with ctypes): the code `helm template` runs, installed from PyPI by .ci/run. Without it
these tests skip on a developer's machine and fail in CI (CI=true).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from hack import render_manifests

NAMESPACE = render_manifests.NAMESPACE


def need_helm() -> None:
    try:
        import helm_python  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("helm-python-sdk (Helm's template engine) is not installed; .ci/run installs it")


@dataclass(frozen=True)
class Rendered:
    template: str
    obj: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind", ""))

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"].get("namespace", ""))

    @property
    def id(self) -> str:
        return f"{self.template}:{self.kind}/{self.name}"


def render(values: Mapping[str, Any] | None = None, *, namespace: str = NAMESPACE) -> list[Rendered]:
    need_helm()
    docs = []
    for template, text in sorted(render_manifests.render_chart(values, namespace=namespace).items()):
        docs += [Rendered(template, d) for d in yaml.safe_load_all(text) if d]
    return docs


def render_error(values: Mapping[str, Any]) -> str:
    """The message Helm fails with for `values` (the test fails when it renders)."""
    need_helm()
    import helm_python

    try:
        render_manifests.render_chart(values)
    except helm_python.HelmError as exc:
        return str(exc)
    raise AssertionError(f"the chart rendered with {values}; expected a refusal")


def one(docs: list[Rendered], kind: str, name: str) -> dict[str, Any]:
    found = [d.obj for d in docs if d.kind == kind and d.name == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)} in {[d.id for d in docs]}"
    return found[0]


def pod_spec(workload: Mapping[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Mapping[str, Any], name: str, *, init: bool = False) -> dict[str, Any]:
    key = "initContainers" if init else "containers"
    (found,) = [c for c in pod_spec(workload).get(key, []) if c["name"] == name]
    return dict(found)


#: Value sets the tests render: each a way people install the chart.
VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    # With the descheduler on (evicting, consolidating hourly): its objects are validated and applied too.
    "standalone": {
        "mode": "standalone",
        "descheduler": {"enabled": True, "dryRun": False, "consolidation": {"everySeconds": 3600}},
    },
    "cert-manager-and-service-monitors": {
        "namespace": {"create": True},
        "webhook": {"tls": {"source": "certManager"}},
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
    },
    "pools-and-own-keys": {
        "agent": {
            "pools": [
                {"name": "default", "isolation": "hami-core", "nodeSelector": {"fgpu.io/pool": "shared"}},
                {"name": "inference", "isolation": "mps", "nodeSelector": {"fgpu.io/pool": "inference"}},
                {"name": "trusted", "isolation": "none", "nodeSelector": {"fgpu.io/pool": "trusted"}},
            ],
            "runtimeSocket": "/run/containerd/containerd.sock",
        },
        "signingKeys": {"source": "existing"},
        "webhook": {"tls": {"source": "certManager", "certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}},
    },
    "no-webhook-no-policies-no-hami": {
        "webhook": {"enabled": False},
        "admissionPolicies": {"enabled": False},
        "hamiCore": {"install": False},
        "image": {"repository": "registry.example.com/fgpu", "tag": "0.1.0", "digest": "sha256:" + "ab" * 32},
    },
}
