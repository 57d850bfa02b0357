"""The resources the double serves: built-in kinds, and the ones CRDs define.

A `ResourceInfo` is what discovery advertises and what routing resolves a
URL to. Custom resources get one per served version of their CRD; all
versions of a resource share storage (no conversion: the double stores what
it was given and only relabels `apiVersion`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_META_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


@dataclass(frozen=True)
class ResourceInfo:
    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    subresources: frozenset[str] = frozenset()
    short_names: tuple[str, ...] = ()
    #: Field selector labels the resource accepts (others get 400, as for real).
    field_labels: frozenset[str] = _META_FIELDS
    #: For custom resources: the version's openAPIV3Schema (None: no schema, keep everything).
    schema: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    custom: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def storage_key(self) -> str:
        return f"{self.group}/{self.plural}"

    @property
    def qualified(self) -> str:
        """How the API server names the resource in messages: `pods`, `devices.scheduling.koordinator.sh`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


_POD_FIELDS = _META_FIELDS | {
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
}
_EVENT_FIELDS = _META_FIELDS | {
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "type",
}

BUILTIN: tuple[ResourceInfo, ...] = (
    ResourceInfo(
        group="",
        version="v1",
        plural="pods",
        singular="pod",
        kind="Pod",
        namespaced=True,
        subresources=frozenset({"status", "binding", "eviction"}),
        short_names=("po",),
        field_labels=_POD_FIELDS,
    ),
    ResourceInfo(
        group="",
        version="v1",
        plural="nodes",
        singular="node",
        kind="Node",
        namespaced=False,
        subresources=frozenset({"status"}),
        short_names=("no",),
        field_labels=_META_FIELDS | {"spec.unschedulable"},
    ),
    ResourceInfo(
        group="",
        version="v1",
        plural="namespaces",
        singular="namespace",
        kind="Namespace",
        namespaced=False,
        subresources=frozenset({"status"}),
        short_names=("ns",),
        field_labels=_META_FIELDS | {"status.phase"},
    ),
    ResourceInfo(
        group="",
        version="v1",
        plural="events",
        singular="event",
        kind="Event",
        namespaced=True,
        short_names=("ev",),
        field_labels=_EVENT_FIELDS,
    ),
    ResourceInfo(
        group="",
        version="v1",
        plural="configmaps",
        singular="configmap",
        kind="ConfigMap",
        namespaced=True,
        short_names=("cm",),
    ),
    ResourceInfo(
        group="",
        version="v1",
        plural="bindings",
        singular="binding",
        kind="Binding",
        namespaced=True,
    ),
    ResourceInfo(
        group="events.k8s.io",
        version="v1",
        plural="events",
        singular="event",
        kind="Event",
        namespaced=True,
        short_names=("ev",),
        field_labels=_META_FIELDS | {"reason", "type", "reportingController"},
    ),
    ResourceInfo(
        group="coordination.k8s.io",
        version="v1",
        plural="leases",
        singular="lease",
        kind="Lease",
        namespaced=True,
    ),
    ResourceInfo(
        group="policy",
        version="v1",
        plural="poddisruptionbudgets",
        singular="poddisruptionbudget",
        kind="PodDisruptionBudget",
        namespaced=True,
        subresources=frozenset({"status"}),
        short_names=("pdb",),
    ),
    # Read by the descheduler (does a pod's owner exist and recreate it?); stored as given.
    ResourceInfo(
        group="apps",
        version="v1",
        plural="replicasets",
        singular="replicaset",
        kind="ReplicaSet",
        namespaced=True,
        subresources=frozenset({"status"}),
        short_names=("rs",),
    ),
    ResourceInfo(
        group="apps",
        version="v1",
        plural="statefulsets",
        singular="statefulset",
        kind="StatefulSet",
        namespaced=True,
        subresources=frozenset({"status"}),
        short_names=("sts",),
    ),
    ResourceInfo(
        group="batch",
        version="v1",
        plural="jobs",
        singular="job",
        kind="Job",
        namespaced=True,
        subresources=frozenset({"status"}),
    ),
    ResourceInfo(
        group="apiextensions.k8s.io",
        version="v1",
        plural="customresourcedefinitions",
        singular="customresourcedefinition",
        kind="CustomResourceDefinition",
        namespaced=False,
        subresources=frozenset({"status"}),
        short_names=("crd", "crds"),
    ),
)

CRD = next(r for r in BUILTIN if r.plural == "customresourcedefinitions")
PODS = next(r for r in BUILTIN if r.plural == "pods" and not r.group)
PDBS = next(r for r in BUILTIN if r.plural == "poddisruptionbudgets")
#: `POST .../bindings` is a verb on pods, not a stored resource.
BINDINGS = next(r for r in BUILTIN if r.plural == "bindings")


def from_crd(crd: Mapping[str, Any]) -> list[ResourceInfo]:
    """One `ResourceInfo` per served version of a (validated) CRD object."""
    spec = crd["spec"]
    names = spec["names"]
    result = []
    for version in spec.get("versions", []):
        if not version.get("served", True):
            continue
        subresources = frozenset(k for k in (version.get("subresources") or {}) if k in ("status", "scale"))
        selectable = {f["jsonPath"].lstrip(".") for f in version.get("selectableFields") or []}
        result.append(
            ResourceInfo(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                singular=names.get("singular") or names["kind"].lower(),
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                subresources=subresources,
                short_names=tuple(names.get("shortNames") or ()),
                field_labels=_META_FIELDS | selectable,
                schema=(version.get("schema") or {}).get("openAPIV3Schema"),
                custom=True,
            )
        )
    return result
