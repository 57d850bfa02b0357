"""The one line a verb prints when the Kubernetes API refuses it: the API's own words, then the fix.

The API's answer says what happened (`401 Unauthorized`, `403 Forbidden ...`, `404 NotFound`) but
not what the operator should do next; kubectl users expect that in the same line.
"""

from __future__ import annotations

from apis import names

#: The Device CRD every fgpu verb reads (hack/deploy/crds/device.yaml).
DEVICE_CRD = f"{names.DEVICE_PLURAL}.{names.DEVICE_GROUP}"

_FIX = {
    401: "the API server did not accept the kubeconfig's credentials: log in again or renew the token "
    "(`kubectl auth whoami` shows whether they work)",
    403: "the credentials lack a permission fgpuctl needs (list and watch nodes, pods, "
    f"{DEVICE_CRD} and poddisruptionbudgets; patch nodes for mig): "
    f"`kubectl auth can-i list {DEVICE_CRD}` shows which",
    # Nodes, pods and PodDisruptionBudgets are always served: a list that is not found is the Device type.
    404: f"the cluster does not serve a resource type fgpuctl reads: is fgpu's Device CRD installed? "
    f"(`kubectl get crd {DEVICE_CRD}`; install fgpu as docs/deploy.md says, or pick its cluster with --context)",
}


def explain(exc: BaseException) -> str:
    """`exc` as one line, with the fix for a refusal whose cause is known by its HTTP status."""
    message = " ".join(str(exc).split())
    fix = _FIX.get(getattr(exc, "status", None) or 0)
    return f"{message}; {fix}" if fix else message
