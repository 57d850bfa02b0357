"""The objects under hack/deploy/, loaded once, looked up by kind and name.

hack/deploy/ is rendered from the Helm chart in deploy/chart/ (hack/render-manifests.sh;
tests/deploy_chart/ fails when it drifts), so these tests check the chart's output as people apply it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "hack" / "deploy"
NAMESPACE = "fgpu-system"


@dataclass(frozen=True)
class Doc:
    """One YAML document of one manifest file."""

    path: Path
    index: int
    obj: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind", ""))

    @property
    def name(self) -> str:
        return str((self.obj.get("metadata") or {}).get("name", ""))

    @property
    def namespace(self) -> str:
        return str((self.obj.get("metadata") or {}).get("namespace", ""))

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(DEPLOY)}:{self.kind}/{self.name}"


@functools.cache
def all_docs() -> tuple[Doc, ...]:
    docs = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        with path.open() as f:
            for i, obj in enumerate(yaml.safe_load_all(f)):
                if obj:
                    docs.append(Doc(path=path, index=i, obj=obj))
    return tuple(docs)


def base_docs() -> tuple[Doc, ...]:
    """What `kubectl apply -f hack/deploy/crds/ -f hack/deploy/` installs: the default deployment,
    kube-scheduler with fgpu-scheduler as its extender (templates and standalone mode are extra)."""
    return tuple(d for d in all_docs() if d.path.parent in (DEPLOY, DEPLOY / "crds"))


def standalone_docs() -> tuple[Doc, ...]:
    """hack/deploy/standalone/: applied after the base, it replaces the scheduler's config and Deployment."""
    return tuple(d for d in all_docs() if d.path.parent == DEPLOY / "standalone")


def webhook_docs() -> tuple[Doc, ...]:
    """hack/deploy/webhook/: the admission webhook, its certificate from cert-manager."""
    return tuple(d for d in all_docs() if d.path.parent == DEPLOY / "webhook")


def find(kind: str, name: str, *, docs: tuple[Doc, ...] | None = None) -> dict[str, Any]:
    matches = [d.obj for d in (docs if docs is not None else base_docs()) if d.kind == kind and d.name == name]
    assert len(matches) == 1, f"expected one {kind}/{name} in hack/deploy, found {len(matches)}"
    return matches[0]


def embedded_yaml(kind: str, name: str, key: str, *, docs: tuple[Doc, ...] | None = None) -> Any:
    """A YAML document held in a ConfigMap's data key, parsed."""
    data = find(kind, name, docs=docs)["data"]
    return yaml.safe_load(data[key])


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod_spec(workload)["containers"] if c["name"] == name]
    return dict(found)


def mount_path_of(workload: dict[str, Any], container_name: str, volume: str) -> str:
    (path,) = [m["mountPath"] for m in container(workload, container_name)["volumeMounts"] if m["name"] == volume]
    return str(path)


def volume(workload: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == name]
    return dict(found)
