"""Overcommit in the chart: a pool's settings reach its agents, the agent may delete pods only when a pool
overcommits, and the shipped admission policy lets it delete only burstable pods on its own node.

The policy's CEL is evaluated as the API server would (tests/localup/admission.py) on the real allocation
annotations the scheduler writes (`apis.signing.allocation_annotations`)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import yaml

from agent.config import parse_config
from agent.reclaim_settings import parse
from apis import names
from apis.allocation import Allocation, ContainerShare, GPUShare, ShareLimit
from apis.signing import allocation_annotations
from tests.deploy_chart.chart import NAMESPACE, container, one, pod_spec, render, render_error
from tests.localup.admission import Request, Verdict, admit
from tests.localup.manifests import find
from tests.signing_keys import signing_key

AGENT = f"system:serviceaccount:{NAMESPACE}:fgpu-agent"
POLICY = find("ValidatingAdmissionPolicy", "fgpu-agent-reclaims-own-burstable-pods")
GiB = 2**30
POOLS = {"agent": {"pools": [
    {"name": "default", "isolation": "hami-core", "nodeSelector": {"fgpu.io/pool": "shared"},
     "overcommit": {"ratio": 1.5, "highWater": 0.9, "cooldown": "1m"}},
    {"name": "inference", "isolation": "mps", "nodeSelector": {"fgpu.io/pool": "inference"}},
]}}


def _pod_rule(docs: list[Any]) -> list[str]:
    role = one(docs, "ClusterRole", "fgpu-agent")
    (rule,) = [r for r in role["rules"] if r["resources"] == ["pods"]]
    return list(rule["verbs"])


def test_a_pools_overcommit_settings_reach_its_agents_and_only_its_own() -> None:
    docs = render(POOLS)
    settings_map = one(docs, "ConfigMap", "fgpu-agent-overcommit")
    settings = parse(yaml.safe_load(settings_map["data"]["overcommit.yaml"]), source="chart")
    assert (settings.ratio, settings.policy.high_water, settings.policy.cooldown_s) == (1.5, 0.9, 60.0)
    config = parse_config(yaml.safe_load(one(docs, "ConfigMap", "fgpu-agent-config")["data"]["agent.yaml"]))
    daemonset = one(docs, "DaemonSet", "fgpu-agent")
    mounts = {m["name"]: m["mountPath"] for m in container(daemonset, "agent")["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(daemonset)["volumes"]}
    assert os.path.dirname(config.overcommit) == mounts["overcommit"]
    assert volumes["overcommit"]["configMap"]["name"] == "fgpu-agent-overcommit"
    assert "items" not in volumes["overcommit"]["configMap"]  # a whole directory: kubelet updates it in place
    other = parse_config(yaml.safe_load(one(docs, "ConfigMap", "fgpu-agent-config-inference")["data"]["agent.yaml"]))
    assert other.overcommit == ""
    assert "overcommit" not in {v["name"] for v in pod_spec(one(docs, "DaemonSet", "fgpu-agent-inference"))["volumes"]}
    assert not [d for d in docs if d.name == "fgpu-agent-overcommit-inference"]


def test_the_agent_may_delete_pods_only_when_a_pool_overcommits() -> None:
    assert _pod_rule(render()) == ["list"]
    assert _pod_rule(render(POOLS)) == ["list", "delete"]


def test_overcommit_on_a_pool_without_isolation_is_refused_with_the_fix() -> None:
    values = {"agent": {"pools": [{"name": "default", "isolation": "none", "overcommit": {"ratio": 2}}]}}
    assert "isolation none bounds no burst; remove overcommit or use hami-core or mps" in render_error(values)


def test_overcommit_without_the_admission_policies_is_refused_naming_both_keys() -> None:
    values = {"admissionPolicies": {"enabled": False}, **POOLS}
    message = render_error(values)
    assert "agent.pools[" in message and "].overcommit needs admissionPolicies.enabled=true" in message
    assert "fgpu-agent-reclaims-own-burstable-pods" in message
    # Without overcommit, a cluster older than 1.30 may still leave the policies out.
    assert _pod_rule(render({"admissionPolicies": {"enabled": False}})) == ["list"]


# --- the admission policy ------------------------------------------------------------------------------------

KEY = signing_key("policy-test")


def _gpu_pod(*, node: str, burstable: bool, name: str = "infer") -> dict[str, Any]:
    share = GPUShare(
        minor=0, uuid=f"GPU-{node}-0", core_percent=20, memory_bytes=4 * GiB, memory_ratio_percent=10,
        containers=(ContainerShare("main", 20, 4 * GiB, 10),),
        limit=ShareLimit(60, 12 * GiB, 30) if burstable else None,
    )
    uid = "cccccccc-0000-4000-8000-000000000001"
    annotations = allocation_annotations(KEY, pod_uid=uid, node_name=node, allocation=Allocation(gpus=(share,)))
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "uid": uid, "annotations": annotations},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x"}]}}


def _delete(pod: dict[str, Any], *, user: str = AGENT, token_node: str | None = "n1") -> Verdict:
    extra = {} if token_node is None else {"authentication.kubernetes.io/node-name": [token_node]}
    return admit(POLICY, Request(operation="DELETE", username=user, object=None, old_object=pod, extra=extra))


def test_an_agent_may_delete_a_burstable_pod_on_its_own_node() -> None:
    assert _delete(_gpu_pod(node="n1", burstable=True)).allowed


@pytest.mark.parametrize(
    ("pod", "token_node", "says"),
    [
        (_gpu_pod(node="n2", burstable=True), "n1", "only delete pods on its own node, not infer"),
        (_gpu_pod(node="n1", burstable=False), "n1", "only delete burstable GPU pods"),
        ({"metadata": {"name": "web", "namespace": "ml"}, "spec": {"nodeName": "n1"}}, "n1", "only delete burstable"),
        ({"metadata": {"name": "pending", "namespace": "ml", "annotations": {}}, "spec": {}}, "n1", "own node"),
        (_gpu_pod(node="n1", burstable=True), None, "own node"),
    ],
    ids=["other-node", "guaranteed", "not-a-gpu-pod", "unbound", "token-not-bound-to-a-node"],
)
def test_an_agent_may_not_delete_other_pods(pod: dict[str, Any], token_node: str | None, says: str) -> None:
    verdict = _delete(pod, token_node=token_node)
    assert not verdict.allowed
    assert says in verdict.message


def test_the_policy_leaves_other_users_deletes_alone_and_is_bound_to_deny() -> None:
    assert _delete(_gpu_pod(node="n2", burstable=False), user="alice@example.com").allowed
    binding = find("ValidatingAdmissionPolicyBinding", "fgpu-agent-reclaims-own-burstable-pods")
    assert binding["spec"] == {"policyName": POLICY["metadata"]["name"], "validationActions": ["Deny"]}
    assert POLICY["spec"]["failurePolicy"] == "Fail"
    assert names.ALLOCATION_BURST_LIMIT in str(POLICY["spec"]["validations"])
    assert names.DEVICE_ALLOCATED in str(POLICY["spec"]["validations"])


def test_the_overcommit_render_validates_against_the_kubernetes_schemas() -> None:
    import kubernetes_validate

    checked = [d for d in render(POOLS) if d.kind in ("ConfigMap", "DaemonSet", "ClusterRole")]
    assert len(checked) >= 5
    for doc in checked:
        kubernetes_validate.validate(doc.obj, "1.30.0", strict=True)
