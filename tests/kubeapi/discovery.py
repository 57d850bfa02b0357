"""Discovery documents (/version, /api, /apis, /apis/<g>, /apis/<g>/<v>) built from the served resources.

The legacy (unaggregated) shapes are enough: the official client's
`DynamicClient` and `kubectl` fall back to them.
"""

from __future__ import annotations

from typing import Any

from tests.kubeapi import errors
from tests.kubeapi.resources import ResourceInfo

VERSION = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0-fgpu-double",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-08-13T00:00:00Z",
    "goVersion": "go1.22.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def _resource_list(group_version: str, resources: list[ResourceInfo]) -> dict[str, Any]:
    entries: list[dict[str, Any]] = []
    for r in resources:
        verbs = ["create"] if r.plural == "bindings" else _VERBS
        entry: dict[str, Any] = {
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": verbs,
        }
        if r.short_names:
            entry["shortNames"] = list(r.short_names)
        entries.append(entry)
        for sub in sorted(r.subresources):
            kind, sub_verbs = (
                ("Binding", ["create"])
                if sub == "binding"
                else ("Eviction", ["create"])
                if sub == "eviction"
                else (r.kind, ["get", "patch", "update"])
            )
            entries.append(
                {
                    "name": f"{r.plural}/{sub}",
                    "singularName": "",
                    "namespaced": r.namespaced,
                    "kind": kind,
                    "verbs": sub_verbs,
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": entries,
    }


def _group(name: str, versions: list[str]) -> dict[str, Any]:
    listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": name,
        "versions": listed,
        "preferredVersion": listed[0],
    }


def document(
    segments: tuple[str, ...], resources: list[ResourceInfo], *, server_address: str
) -> dict[str, Any]:
    groups: dict[str, list[str]] = {}
    for r in resources:
        if r.group and r.version not in groups.setdefault(r.group, []):
            groups[r.group].append(r.version)
    match segments:
        case ():
            paths = ["/api", "/api/v1", "/apis", "/version", "/healthz", "/readyz", "/livez"]
            paths += [f"/apis/{g}" for g in groups] + [
                f"/apis/{g}/{v}" for g, vs in groups.items() for v in vs
            ]
            return {"paths": sorted(paths)}
        case ("version",):
            return dict(VERSION)
        case ("api",):
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
            }
        case ("api", "v1"):
            return _resource_list("v1", [r for r in resources if not r.group])
        case ("apis",):
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [_group(g, vs) for g, vs in groups.items()],
            }
        case ("apis", group) if group in groups:
            return _group(group, groups[group])
        case ("apis", group, version) if version in groups.get(group, []):
            return _resource_list(
                f"{group}/{version}", [r for r in resources if (r.group, r.version) == (group, version)]
            )
    raise errors.path_not_found("/" + "/".join(segments))
