"""Per-kind rules applied on create and update, after kube-apiserver's registry strategies.

The ones production code can trip over are kept: pods start `Pending` with a
QoS class whatever status the client sent; a pod's spec is immutable apart
from images, tolerations and deadlines (so a scheduler must bind, not update
`spec.nodeName`); a write to the main resource ignores `.status` and a write
to `/status` ignores everything but `.status` and metadata; custom resources
with a status subresource drop `.status` on create; `metadata.generation`
counts spec changes; no finalizer may be added to an object being deleted.
"""

from __future__ import annotations

import copy
import re
import secrets
from collections.abc import Mapping
from typing import Any

from tests.kubeapi import errors, schema
from tests.kubeapi.resources import ResourceInfo

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand

#: Pod spec fields an update may change (everything else is immutable once created).
_POD_MUTABLE_SPEC = (
    "activeDeadlineSeconds",
    "tolerations",
    "schedulingGates",
    "terminationGracePeriodSeconds",
)

Causes = list[tuple[str, str]]


def generate_name(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(5))


def _check_string_map(meta: Mapping[str, Any], field: str) -> None:
    values = meta.get(field)
    if values is None:
        return
    if not isinstance(values, Mapping):
        raise errors.bad_request(
            f"metadata.{field} must be an object of strings, got {type(values).__name__}"
        )
    for key, value in values.items():
        if not isinstance(value, str):
            raise errors.bad_request(
                f"json: cannot unmarshal {type(value).__name__} into Go struct field "
                f"ObjectMeta.metadata.{field} of type string (key {key!r}: quote the value)"
            )


def validate_meta(obj: Mapping[str, Any]) -> Causes:
    meta = obj.get("metadata") or {}
    _check_string_map(meta, "labels")
    _check_string_map(meta, "annotations")
    causes: Causes = []
    name = meta.get("name")
    if not name:
        causes.append(("metadata.name", "Required value: name or generateName is required"))
    elif len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        causes.append(
            (
                "metadata.name",
                f"Invalid value: {name!r}: a lowercase RFC 1123 subdomain must consist of lower case "
                "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            )
        )
    for key, value in (meta.get("labels") or {}).items():
        label_name = key.rsplit("/", 1)[-1]
        if not _LABEL_NAME.match(label_name) or len(label_name) > 63:
            causes.append((f"metadata.labels[{key}]", f"Invalid value: {key!r}: not a valid label key"))
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            causes.append(
                (
                    f"metadata.labels[{key}]",
                    f"Invalid value: {value!r}: a valid label must be 63 characters or less, "
                    "alphanumeric, '-', '_' or '.', starting and ending with an alphanumeric character",
                )
            )
    return causes


def _pod_qos(spec: Mapping[str, Any]) -> str:
    containers = list(spec.get("containers") or []) + list(spec.get("initContainers") or [])
    requests_seen = False
    guaranteed = True
    for container in containers:
        resources = container.get("resources") or {}
        requests = resources.get("requests") or {}
        limits = resources.get("limits") or {}
        if requests or limits:
            requests_seen = True
        for name in ("cpu", "memory"):
            if name not in limits or requests.get(name, limits[name]) != limits[name]:
                guaranteed = False
    if not requests_seen:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _validate_pod(obj: Mapping[str, Any]) -> Causes:
    spec = obj.get("spec") or {}
    containers = spec.get("containers")
    if not containers:
        return [("spec.containers", "Required value")]
    causes: Causes = []
    for index, container in enumerate(containers):
        for field in ("name", "image"):
            if not container.get(field):
                causes.append((f"spec.containers[{index}].{field}", "Required value"))
    return causes


def _validate_crd(obj: Mapping[str, Any]) -> Causes:
    spec = obj.get("spec") or {}
    names = spec.get("names") or {}
    causes: Causes = []
    for field, value in (
        ("spec.group", spec.get("group")),
        ("spec.names.plural", names.get("plural")),
        ("spec.names.kind", names.get("kind")),
    ):
        if not value:
            causes.append((field, "Required value"))
    if spec.get("scope") not in ("Cluster", "Namespaced"):
        causes.append(
            ("spec.scope", f"Unsupported value: {spec.get('scope')!r}: supported values: Cluster, Namespaced")
        )
    if not spec.get("versions"):
        causes.append(
            ("spec.versions", "Required value: must have exactly one version marked as storage version")
        )
    expected = f"{names.get('plural')}.{spec.get('group')}"
    if not causes and obj["metadata"]["name"] != expected:
        causes.append(
            (
                "metadata.name",
                f'Invalid value: {obj["metadata"]["name"]!r}: must be spec.names.plural+"."+spec.group ({expected})',
            )
        )
    return causes


def _crd_status(obj: dict[str, Any]) -> None:
    spec = obj["spec"]
    names = dict(spec["names"])
    names.setdefault("singular", names["kind"].lower())
    names.setdefault("listKind", names["kind"] + "List")
    now = obj["metadata"]["creationTimestamp"]
    obj["status"] = {
        "acceptedNames": names,
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "reason": "NoConflicts",
                "lastTransitionTime": now,
                "message": "no conflicts found",
            },
            {
                "type": "Established",
                "status": "True",
                "reason": "InitialNamesAccepted",
                "lastTransitionTime": now,
                "message": "the initial names have been accepted",
            },
        ],
        "storedVersions": [v["name"] for v in spec["versions"] if v.get("storage", True)],
    }


def _validate(resource: ResourceInfo, obj: dict[str, Any]) -> Causes:
    causes = validate_meta(obj)
    if resource.kind == "Pod" and not resource.group:
        causes += _validate_pod(obj)
    elif resource.kind == "CustomResourceDefinition":
        causes += _validate_crd(obj)
    elif resource.custom and resource.schema is not None:
        causes += schema.validate(obj, resource.schema)
    return causes


def prepare_create(resource: ResourceInfo, obj: dict[str, Any], *, now: str, uid: str) -> None:
    """Fill server-set fields and apply create-time rules; raises 422 on invalid objects."""
    meta = obj.setdefault("metadata", {})
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = generate_name(meta["generateName"])
    obj["apiVersion"] = resource.api_version
    obj["kind"] = resource.kind
    if resource.custom and resource.schema is not None:
        schema.prune(obj, resource.schema)
        schema.apply_defaults(obj, resource.schema)
    if resource.custom and resource.has_status:
        obj.pop("status", None)
    if resource.kind == "Pod" and not resource.group:
        spec = obj.setdefault("spec", {})
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        obj["status"] = {"phase": "Pending", "qosClass": _pod_qos(spec)}
    if resource.kind == "Namespace":
        obj.setdefault("status", {}).setdefault("phase", "Active")
    causes = _validate(resource, obj)
    if causes:
        raise errors.invalid(resource, meta.get("name") or meta.get("generateName") or "", causes)
    for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
        meta.pop(key, None)
    meta["uid"] = uid
    meta["creationTimestamp"] = now
    if "spec" in obj or resource.custom:
        meta["generation"] = 1
    if resource.kind == "CustomResourceDefinition":
        _crd_status(obj)


def _spec_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _pod_spec_frozen(spec: Mapping[str, Any]) -> dict[str, Any]:
    frozen = {k: v for k, v in spec.items() if k not in _POD_MUTABLE_SPEC}
    for field in ("containers", "initContainers"):
        frozen[field] = [{k: v for k, v in c.items() if k != "image"} for c in spec.get(field) or []]
    return frozen


def _check_pod_spec_unchanged(
    resource: ResourceInfo, name: str, old: Mapping[str, Any], new: Mapping[str, Any]
) -> None:
    if _pod_spec_frozen(old.get("spec") or {}) != _pod_spec_frozen(new.get("spec") or {}):
        raise errors.invalid(
            resource,
            name,
            [
                (
                    "spec",
                    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
                    "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` "
                    "(only additions to existing tolerations) or `spec.terminationGracePeriodSeconds`; "
                    "to assign a node, POST pods/binding",
                )
            ],
        )


def prepare_update(
    resource: ResourceInfo, old: Mapping[str, Any], new: dict[str, Any], *, subresource: str | None
) -> dict[str, Any]:
    """The object to store for an update of `old` to `new` (a fresh dict the caller owns)."""
    if subresource == "status":
        result = copy.deepcopy(dict(old))
        result["status"] = new.get("status")
        if result["status"] is None:
            result.pop("status")
        if not resource.custom:
            meta = new.get("metadata") or {}
            for key in ("labels", "annotations"):
                if key in meta:
                    result["metadata"][key] = meta[key]
                else:
                    result["metadata"].pop(key, None)
    else:
        result = new
        result["apiVersion"] = resource.api_version
        result["kind"] = resource.kind
        if resource.custom and resource.schema is not None:
            schema.prune(result, resource.schema)
            schema.apply_defaults(result, resource.schema)
        if resource.has_status:
            if "status" in old:
                result["status"] = copy.deepcopy(old["status"])
            else:
                result.pop("status", None)
    old_meta = old.get("metadata") or {}
    meta = result.setdefault("metadata", {})
    for key in (
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "name",
        "namespace",
    ):
        if key in old_meta:
            meta[key] = old_meta[key]
        else:
            meta.pop(key, None)
    name = old_meta.get("name", "")
    if old_meta.get("deletionTimestamp"):
        added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
        if added:
            raise errors.invalid(
                resource,
                name,
                [
                    (
                        "metadata.finalizers",
                        f"Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {sorted(added)!r}",
                    )
                ],
            )
    if resource.kind == "Pod" and not resource.group and subresource is None:
        _check_pod_spec_unchanged(resource, name, old, result)
    causes = _validate(resource, result)
    if causes:
        raise errors.invalid(resource, name, causes)
    if "generation" in old_meta and _spec_part(old) != _spec_part(result):
        meta["generation"] = int(old_meta["generation"]) + 1
    return result
