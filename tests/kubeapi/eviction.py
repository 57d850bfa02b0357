"""`POST pods/<name>/eviction`: a pod deletion that honours PodDisruptionBudgets, as kube-apiserver's EvictionREST.

What the real registry does (pkg/registry/core/pod/storage/eviction.go), and the double with it:
  * a pod already terminal (Succeeded/Failed), still Pending, or being deleted is deleted with no
    budget check;
  * otherwise the policy/v1 PodDisruptionBudgets of the pod's namespace whose selector matches
    its labels are looked up: none -> deleted; more than one -> 500 (the subresource does not
    support it); one whose `status.observedGeneration` lags its generation, or whose
    `status.disruptionsAllowed` is 0 -> 429 TooManyRequests with a `DisruptionBudget` cause; a
    negative one -> 403;
  * else the budget's status is written first (`disruptionsAllowed` - 1 and the pod in
    `disruptedPods`), then the pod is deleted with the Eviction's `deleteOptions`; 201 Success.
  * `deleteOptions.preconditions` (uid, resourceVersion) are checked by that delete, as the real
    registry's `store.Delete` does: a pod replaced under the same name answers 409 "Precondition
    failed: UID in precondition: ..." and stays (after the budget was spent, as for real: the
    disruption controller gives it back).
There is no disruption controller here: the test (or a helper) keeps the budgets' status, as the
controller-manager would.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from tests.kubeapi import errors
from tests.kubeapi.resources import PDBS, PODS
from tests.kubeapi.store import Store

_VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."


def _selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector; a null selector selects nothing, an empty one everything (policy/v1)."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def _too_many(pdb: Mapping[str, Any], message: str) -> errors.ApiError:
    return errors.ApiError(
        code=429,
        reason="TooManyRequests",
        message=_VIOLATION,
        details={"causes": [{"reason": "DisruptionBudget", "message": message}]},
    )


def evict(store: Store, namespace: str, name: str, body: Any, *, now: str) -> dict[str, Any]:
    if body is not None and not isinstance(body, Mapping):
        raise errors.bad_request(f"the body of an eviction must be an Eviction, got {type(body).__name__}")
    eviction = body or {}
    named = (eviction.get("metadata") or {}).get("name")
    if named and named != name:
        raise errors.bad_request(f"name in URL does not match name in Eviction object ({named} != {name})")
    options = dict(eviction.get("deleteOptions") or {})
    with store.cond:
        pod = store.get(PODS, namespace, name)
        phase = (pod.get("status") or {}).get("phase", "Pending")
        if phase in ("Succeeded", "Failed", "Pending") or pod["metadata"].get("deletionTimestamp"):
            store.delete(PODS, namespace, name, options)
            return _success()
        labels = pod["metadata"].get("labels") or {}
        matching = [
            pdb
            for pdb in store.list_objects(PDBS, namespace, lambda _obj: True)["items"]
            if _selects((pdb.get("spec") or {}).get("selector"), labels)
        ]
        if len(matching) > 1:
            raise errors.ApiError(
                code=500,
                reason="InternalError",
                message="This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            )
        if matching:
            pdb = matching[0]
            status = pdb.get("status") or {}
            pdb_name = pdb["metadata"]["name"]
            if status.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
                raise _too_many(pdb, f"The disruption budget {pdb_name} is still being processed by the server.")
            allowed = int(status.get("disruptionsAllowed", 0))
            if allowed < 0:
                raise errors.ApiError(code=403, reason="Forbidden", message="pdb disruptions allowed is negative")
            if allowed == 0:
                raise _too_many(
                    pdb,
                    f"The disruption budget {pdb_name} needs {status.get('desiredHealthy', 0)} healthy pods "
                    f"and has {status.get('currentHealthy', 0)} currently",
                )
            updated = copy.deepcopy(pdb)
            updated["status"] = {
                **status,
                "disruptionsAllowed": allowed - 1,
                "disruptedPods": {**(status.get("disruptedPods") or {}), name: now},
            }
            store.update(PDBS, namespace, pdb_name, updated, subresource="status")
        store.delete(PODS, namespace, name, options)
    return _success()


def _success() -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
