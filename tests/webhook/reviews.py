"""AdmissionReview v1 requests as the API server sends them, around whole Pod objects.

By the time admission runs the API server has defaulted the pod (so it names
`default-scheduler`, has tolerations, a service-account volume, managedFields)
and filled in the namespace; a ReplicaSet's pods come with generateName and no
name. `pod()` builds such a pod; `review()` wraps it.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Mapping
from typing import Any

Pod = dict[str, Any]


def pod(
    *,
    resources: Mapping[str, object] | None = None,
    containers: list[dict[str, Any]] | None = None,
    namespace: str = "ml",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    scheduler: str | None = "default-scheduler",
    name: str = "",
) -> Pod:
    """A defaulted pod of a ReplicaSet; `resources` are the main container's limits."""
    limits = dict(resources or {})
    main = {
        "name": "main",
        "image": "nvcr.io/nvidia/pytorch:24.04-py3",
        "command": ["python", "train.py"],
        "env": [{"name": "EPOCHS", "value": "10"}],
        "resources": {"limits": limits, "requests": dict(limits)} if limits else {},
        "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": True,
                          "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }
    meta: dict[str, Any] = {
        "generateName": "train-7d9f8c-",
        "namespace": namespace,
        "creationTimestamp": None,
        "labels": {"app": "train", "pod-template-hash": "7d9f8c", **(labels or {})},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train-7d9f8c",
                             "uid": "9b0a6f2e-1c1d-4c0e-9a43-0e7d1c2b3a4f", "controller": True,
                             "blockOwnerDeletion": True}],
        "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                           "time": "2024-05-01T10:00:00Z", "fieldsType": "FieldsV1",
                           "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}}},
                                        "f:spec": {"f:containers": {'k:{"name":"main"}': {".": {}, "f:image": {}}}}}}],
    }
    if name:
        meta["name"] = name
        del meta["generateName"]
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    spec: dict[str, Any] = {
        "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1",
                                                                          "fieldPath": "metadata.namespace"}}]}}]}}],
        "containers": containers if containers is not None else [main],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "securityContext": {},
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        ],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec, "status": {}}


def review(
    obj: Mapping[str, Any] | None,
    *,
    operation: str = "CREATE",
    old: Mapping[str, Any] | None = None,
    dry_run: bool = False,
    namespace: str | None = None,
    kind: Mapping[str, str] | None = None,
    resource: str = "pods",
    sub_resource: str = "",
) -> dict[str, Any]:
    """The AdmissionReview the API server POSTs for `operation` on `obj`."""
    meta = (obj or old or {}).get("metadata", {})
    gvk = dict(kind or {"group": "", "version": "v1", "kind": "Pod"})
    gvr = {"group": gvk["group"], "version": gvk["version"], "resource": resource}
    options = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}.get(operation)
    request: dict[str, Any] = {
        "uid": str(uuid.uuid4()),
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "namespace": namespace if namespace is not None else meta.get("namespace", "default"),
        "operation": operation,
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                     "uid": "1f7d2c3a-0000-4000-8000-000000000001",
                     "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]},
        "object": copy.deepcopy(obj) if obj is not None else None,
        "oldObject": copy.deepcopy(old) if old is not None else None,
        "dryRun": dry_run,
        "options": {"kind": options, "apiVersion": "meta.k8s.io/v1"} if options else None,
    }
    if meta.get("name"):
        request["name"] = meta["name"]
    if sub_resource:
        request["subResource"] = sub_resource
    return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}


def body(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value).encode()
