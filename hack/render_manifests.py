"""Renders hack/deploy/ from the Helm chart in deploy/chart/, so the plain manifests never drift from it.

    hack/render-manifests.sh            # rewrite hack/deploy/ from the chart
    hack/render-manifests.sh --check    # exit 1 and name every file that differs (CI: tests/deploy_chart/)

The chart is rendered with Helm's own template engine (Helm v4's Go SDK, through the
helm-python-sdk package's libhelm_c, the same code as `helm template`), offline: `lookup`
finds nothing, so nothing here depends on a cluster. What goes where:

    hack/deploy/*.yaml           the default install (extender mode), keys and webhook left out
    hack/deploy/standalone/      mode=standalone: the scheduler's ConfigMap and Deployment
    hack/deploy/templates/       signingKeys.source=values with no values: the GitOps key templates
    hack/deploy/webhook/         the admission webhook, with its certificate from cert-manager
    hack/deploy/monitoring/      the Grafana dashboard ConfigMap and the PrometheusRule of alerts
                                 (metrics.grafanaDashboard.enabled, metrics.prometheusRule.enabled)
    hack/deploy/descheduler/     fgpu-descheduler (descheduler.enabled, dry-run as the chart defaults)
    hack/deploy/crds/device.yaml the chart's crds/device.yaml

Each file is one chart template (the key templates split by kind), under a header naming it.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "chart"
DEPLOY = REPO / "hack" / "deploy"
RELEASE = "fgpu"
NAMESPACE = "fgpu-system"
#: The directories under hack/deploy/ that are rendered; anything else there (image/, scripts) is not.
MANAGED_DIRS = ("", "standalone", "templates", "webhook", "monitoring", "descheduler", "crds")

#: What `kubectl apply -f hack/deploy/` installs: the namespace too, and neither keys (the
#: operator makes them, docs/deploy.md) nor the webhook (its own directory).
BASE_VALUES: dict[str, Any] = {
    "namespace": {"create": True},
    "signingKeys": {"source": "existing"},
    "webhook": {"enabled": False},
}


@dataclass(frozen=True)
class Output:
    """One rendered file: `template` of the chart rendered with `values`, written to `path`."""

    path: str
    template: str
    values: Mapping[str, Any] = field(default_factory=dict)
    #: Only this kind's documents of the template (the key templates share one chart template).
    kind: str = ""


def outputs() -> list[Output]:
    base = [
        Output(path=t, template=t, values=BASE_VALUES)
        for t in (
            "00-namespace.yaml",
            "10-rbac-agent.yaml",
            "10-rbac-kube-scheduler.yaml",
            "10-rbac-scheduler.yaml",
            "20-agent-config.yaml",
            "20-kube-scheduler-config.yaml",
            "20-scheduler-config.yaml",
            "20-translation-rules.yaml",
            "30-agent.yaml",
            "30-scheduler.yaml",
            "30-scheduler-service.yaml",
            "40-agent-node-restriction.yaml",
            "40-scheduler-owns-allocations.yaml",
        )
    ]
    standalone = _merged(BASE_VALUES, {"mode": "standalone"})
    keys = _merged(BASE_VALUES, {"signingKeys": {"source": "values"}})
    webhook = _merged(BASE_VALUES, {"webhook": {"enabled": True, "tls": {"source": "certManager"}}})
    monitoring = _merged(
        BASE_VALUES, {"metrics": {"grafanaDashboard": {"enabled": True}, "prometheusRule": {"enabled": True}}}
    )
    descheduler = _merged(BASE_VALUES, {"descheduler": {"enabled": True}})
    return [
        *base,
        Output(path="standalone/20-scheduler-config.yaml", template="20-scheduler-config.yaml", values=standalone),
        Output(path="standalone/30-scheduler.yaml", template="30-scheduler.yaml", values=standalone),
        Output(path="templates/signing-key-secret.yaml", template="signing-keys.yaml", values=keys, kind="Secret"),
        Output(path="templates/verifying-keys-configmap.yaml", template="signing-keys.yaml", values=keys, kind="ConfigMap"),
        Output(path="webhook/50-webhook.yaml", template="50-webhook.yaml", values=webhook),
        Output(path="webhook/50-webhook-configurations.yaml", template="50-webhook-configurations.yaml", values=webhook),
        Output(path="monitoring/60-grafana-dashboard.yaml", template="60-grafana-dashboard.yaml", values=monitoring),
        Output(path="monitoring/60-prometheus-rules.yaml", template="60-prometheus-rules.yaml", values=monitoring),
        Output(path="descheduler/55-descheduler.yaml", template="55-descheduler.yaml", values=descheduler),
    ]


def render_chart(values: Mapping[str, Any] | None = None, *, namespace: str = NAMESPACE) -> dict[str, str]:
    """Every template of the chart rendered with `values`, by template file name ("30-agent.yaml")."""
    try:
        import helm_python as helm
    except ImportError as exc:  # said plainly: the test suite and the script both need it
        raise SystemExit(
            f"the Helm engine is missing ({exc}); install it with `.venv/bin/pip install helm-python-sdk` "
            "(.ci/run does)"
        ) from exc
    with helm.Chart.load(str(CHART)) as chart:
        rendered = chart.render(dict(values or {}), name=RELEASE, namespace=namespace)
    prefix = f"{chart_name()}/templates/"
    return {path.removeprefix(prefix): text for path, text in rendered.items() if path.startswith(prefix)}


def chart_name() -> str:
    for line in (CHART / "Chart.yaml").read_text().splitlines():
        if line.startswith("name:"):
            return line.split(":", 1)[1].strip()
    raise SystemExit(f"{CHART / 'Chart.yaml'} has no name")


def render_all() -> dict[str, str]:
    """The content of every managed file, by path relative to hack/deploy/."""
    cache: dict[str, dict[str, str]] = {}
    files: dict[str, str] = {}
    for out in outputs():
        key = repr(sorted(_flat(out.values)))
        if key not in cache:
            cache[key] = render_chart(out.values)
        text = cache[key].get(out.template, "")
        if out.kind:
            text = "\n---\n".join(d for d in split_documents(text) if _kind_of(d) == out.kind)
        text = normalise(text)
        if not text.strip():
            continue
        files[out.path] = f"# Rendered from deploy/chart/templates/{out.template} by hack/render-manifests.sh;\n" \
            "# edit the chart and render again, not this file.\n" + text
    files["crds/device.yaml"] = (CHART / "crds" / "device.yaml").read_text()
    return files


def split_documents(text: str) -> list[str]:
    docs: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        if line.rstrip() == "---":
            docs.append("\n".join(current))
            current = []
        else:
            current.append(line)
    docs.append("\n".join(current))
    return [d for d in docs if d.strip()]


def normalise(text: str) -> str:
    """Trailing spaces off, no leading or doubled-up blank document markers, one final newline."""
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and lines[0] == "---":
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n" if lines else ""


def managed_files(deploy: Path = DEPLOY) -> dict[str, Path]:
    """The *.yaml files now in the managed directories of `deploy` (hack/deploy/)."""
    found: dict[str, Path] = {}
    for sub in MANAGED_DIRS:
        directory = deploy / sub
        if directory.is_dir():
            for path in sorted(directory.glob("*.yaml")):
                found[path.relative_to(deploy).as_posix()] = path
    return found


def differences(files: Mapping[str, str], *, deploy: Path = DEPLOY) -> list[str]:
    """What differs between `files` and `deploy` (hack/deploy/), one line per file."""
    present = managed_files(deploy)
    problems = []
    for rel, text in sorted(files.items()):
        path = deploy / rel
        if rel not in present:
            problems.append(f"hack/deploy/{rel}: missing")
        elif path.read_text() != text:
            problems.append(f"hack/deploy/{rel}: differs from the chart's rendering")
    problems += [f"hack/deploy/{rel}: not rendered from the chart (stale?)" for rel in sorted(set(present) - set(files))]
    return problems


def write(files: Mapping[str, str]) -> None:
    for rel, path in managed_files().items():
        if rel not in files:
            path.unlink()
    for rel, text in files.items():
        path = DEPLOY / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/render-manifests.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when hack/deploy/ differs")
    args = parser.parse_args(argv)
    files = render_all()
    if args.check:
        problems = differences(files)
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("run hack/render-manifests.sh to render hack/deploy/ from deploy/chart/", file=sys.stderr)
        return 1 if problems else 0
    write(files)
    print(f"rendered {len(files)} files into hack/deploy/ from deploy/chart/")
    return 0


def _merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _flat(values: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    items: list[tuple[str, str]] = []
    for key, value in values.items():
        if isinstance(value, Mapping):
            items += _flat(value, f"{prefix}{key}.")
        else:
            items.append((f"{prefix}{key}", repr(value)))
    return items


def _kind_of(document: str) -> str:
    for line in document.splitlines():
        if line.startswith("kind:"):
            return line.split(":", 1)[1].strip()
    return ""


if __name__ == "__main__":
    sys.exit(main())
