"""hack/deploy/40-scheduler-owns-allocations.yaml: only fgpu-scheduler's service account may set, change
or remove a pod's allocation, signature and node annotations.

The shipped policy's CEL is evaluated (tests/localup/admission.py) against the writes that matter:
pods created with a forged allocation (by hand or by a controller from a template), a running pod
editing its own, the scheduler's bind and rollback, kubelet's status updates, bindings.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from apis import names
from tests.localup.admission import Request, Verdict, admit
from tests.localup.manifests import NAMESPACE, find, pod_spec

POLICY = find("ValidatingAdmissionPolicy", "fgpu-scheduler-owns-allocations")
AGENT_POLICY = find("ValidatingAdmissionPolicy", "fgpu-agent-own-node")

SCHEDULER = f"system:serviceaccount:{NAMESPACE}:fgpu-scheduler"
USER = "alice@example.com"
REPLICASET_CONTROLLER = "system:serviceaccount:kube-system:replicaset-controller"
KUBELET = "system:node:n1"
ALLOCATION = {
    names.DEVICE_ALLOCATED: '{"gpu":[{"minor":0,"id":"GPU-n1-0","resources":{"koordinator.sh/gpu-core":"50"}}]}',
    names.ALLOCATION_SIGNATURE: "v2:k1:c2lnbmF0dXJl",
    names.ALLOCATION_NODE: "n1",
}


def _pod(annotations: dict[str, str] | None = None, *, node: str = "", labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": names.SCHEDULER_NAME, "containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    metadata: dict[str, Any] = {"name": "p", "namespace": "default", "labels": dict(labels or {})}
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": {"phase": "Pending"}}


def _create(user: str, obj: dict[str, Any], *, subresource: str = "") -> Verdict:
    return admit(POLICY, Request(operation="CREATE", username=user, object=obj, subresource=subresource))


def _update(user: str, old: dict[str, Any], new: dict[str, Any], *, subresource: str = "") -> Verdict:
    return admit(POLICY, Request(operation="UPDATE", username=user, object=new, old_object=old, subresource=subresource))


def _with(pod: dict[str, Any], **annotations: str | None) -> dict[str, Any]:
    """`pod` with annotations set (a str) or removed (None), keys given by their names.py constant's value."""
    out = copy.deepcopy(pod)
    current = out["metadata"].setdefault("annotations", {})
    for key, value in annotations.items():
        real = {"allocated": names.DEVICE_ALLOCATED, "signature": names.ALLOCATION_SIGNATURE, "node": names.ALLOCATION_NODE}.get(key, key)
        if value is None:
            current.pop(real, None)
        else:
            current[real] = value
    return out


BOUND = _pod(ALLOCATION, node="n1")


def test_the_policy_guards_exactly_the_annotations_the_scheduler_signs() -> None:
    keys = next(v for v in POLICY["spec"]["variables"] if v["name"] == "keys")["expression"]
    listed = {part.strip().strip("'") for part in keys.strip().strip("[]").split(",")}

    assert listed == {names.DEVICE_ALLOCATED, names.ALLOCATION_SIGNATURE, names.ALLOCATION_NODE}


def test_the_exempt_identity_is_the_service_account_the_scheduler_pod_runs_as() -> None:
    (condition,) = POLICY["spec"]["matchConditions"]
    account = find("ServiceAccount", "fgpu-scheduler")

    assert f"'{SCHEDULER}'" in condition["expression"]
    assert f"system:serviceaccount:{account['metadata']['namespace']}:{account['metadata']['name']}" == SCHEDULER
    assert pod_spec(find("Deployment", "fgpu-scheduler"))["serviceAccountName"] == "fgpu-scheduler"


def test_the_binding_denies_with_the_policy() -> None:
    binding = find("ValidatingAdmissionPolicyBinding", "fgpu-scheduler-owns-allocations")

    assert binding["spec"] == {"policyName": POLICY["metadata"]["name"], "validationActions": ["Deny"]}
    assert POLICY["spec"]["failurePolicy"] == "Fail"


def test_a_pod_created_without_allocation_annotations_is_admitted_for_anyone() -> None:
    assert _create(USER, _pod()).allowed
    assert _create(USER, _pod({"team": "ml"})).allowed
    assert _create(REPLICASET_CONTROLLER, _pod({"team": "ml"})).allowed


@pytest.mark.parametrize("key", [names.DEVICE_ALLOCATED, names.ALLOCATION_SIGNATURE, names.ALLOCATION_NODE])
def test_a_pod_created_with_an_allocation_annotation_is_refused_naming_it_and_the_fix(key: str) -> None:
    verdict = _create(USER, _pod({key: ALLOCATION[key]}, node="n1"))

    assert not verdict.allowed
    assert verdict.message == (
        f"pod annotation {key} may be set, changed or removed only by fgpu-scheduler ({SCHEDULER}), not by {USER}; "
        "remove it from the pod or its template and let fgpu-scheduler place the pod"
    )


def test_a_pod_a_controller_creates_from_a_template_carrying_an_allocation_is_refused() -> None:
    verdict = _create(REPLICASET_CONTROLLER, _pod(ALLOCATION))

    assert not verdict.allowed and REPLICASET_CONTROLLER in verdict.message


def test_the_scheduler_may_write_the_allocation_and_roll_it_back() -> None:
    pending = _pod()

    assert _update(SCHEDULER, pending, _with(pending, **ALLOCATION)).allowed
    assert _update(SCHEDULER, _with(pending, **ALLOCATION), pending).allowed


@pytest.mark.parametrize(
    "edit",
    [
        {"allocated": '{"gpu":[{"minor":0,"id":"GPU-n1-0","resources":{"koordinator.sh/gpu-core":"1"}}]}'},
        {"signature": "v2:k1:b3RoZXI"},
        {"node": "n2"},
        {"allocated": None},
        {"signature": None, "node": None},
    ],
    ids=["allocation-edited-down", "signature-replaced", "node-changed", "allocation-removed", "two-removed"],
)
def test_anyone_else_changing_or_removing_a_running_pods_allocation_is_refused(edit: dict[str, str | None]) -> None:
    verdict = _update(USER, BOUND, _with(BOUND, **edit))

    assert not verdict.allowed and USER in verdict.message


def test_adding_an_allocation_to_an_existing_pod_is_refused() -> None:
    pending = _pod()

    assert not _update(USER, pending, _with(pending, **ALLOCATION)).allowed
    assert not _update(USER, _pod(None), _with(_pod(None), allocated="{}")).allowed


def test_edits_that_leave_the_allocation_alone_are_admitted() -> None:
    relabelled = _with(BOUND, team="ml")
    relabelled["metadata"]["labels"] = {"app": "x"}
    relabelled["metadata"]["finalizers"] = ["example.com/keep"]

    assert _update(USER, BOUND, relabelled).allowed
    assert _update(REPLICASET_CONTROLLER, _pod(), _with(_pod(), team="ml")).allowed


def test_kubelet_status_updates_pass_but_a_status_write_that_edits_the_allocation_does_not() -> None:
    running = copy.deepcopy(BOUND)
    running["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}

    assert _update(KUBELET, BOUND, running, subresource="status").allowed
    assert not _update(KUBELET, BOUND, _with(running, node="n9"), subresource="status").allowed


def test_a_binding_may_not_carry_allocation_annotations_for_anyone_but_the_scheduler() -> None:
    def binding(annotations: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "p", "namespace": "default", "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
        }

    other_scheduler = "system:kube-scheduler"
    assert _create(other_scheduler, binding({}), subresource="binding").allowed
    assert not _create(other_scheduler, binding(ALLOCATION), subresource="binding").allowed
    assert _create(SCHEDULER, binding(ALLOCATION), subresource="binding").allowed


def test_deleting_a_pod_is_not_the_policys_business() -> None:
    assert admit(POLICY, Request(operation="DELETE", username=USER, object=None, old_object=BOUND)).allowed


def test_the_agent_policy_lets_an_agent_write_only_its_own_nodes_device() -> None:
    """The same evaluator on the other shipped policy, 40-agent-node-restriction.yaml."""
    agent = f"system:serviceaccount:{NAMESPACE}:fgpu-agent"
    device = {"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device", "metadata": {"name": "n1"}}

    def write(node_of_token: str) -> Verdict:
        return admit(
            AGENT_POLICY,
            Request(
                operation="CREATE",
                username=agent,
                object=device,
                resource="devices",
                group="scheduling.koordinator.sh",
                extra={"authentication.kubernetes.io/node-name": [node_of_token]},
            ),
        )

    assert write("n1").allowed
    refused = write("n2")
    assert not refused.allowed and refused.message.endswith("not n1")
