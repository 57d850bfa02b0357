"""pod_request_from_pod: a manifest (dict or V1Pod) to the core's PodRequest."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from apis import names
from apis.request import RequestError
from scheduler_plugin.core.api import LabelRequirement
from scheduler_plugin.core.podrequest import pod_request_from_pod


def _pod(
    *,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
    limits: dict[str, str] | None = None,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "w0", "namespace": "ml", "uid": "uid-w0"}
    if annotations:
        meta["annotations"] = annotations
    if labels:
        meta["labels"] = labels
    if owners:
        meta["ownerReferences"] = owners
    container = {
        "name": "main",
        "resources": {
            "limits": limits if limits is not None else {names.NVIDIA_GPU: "1"},
            "requests": {"cpu": "2", "memory": "4Gi"},
        },
    }
    return {"metadata": meta, "spec": {"containers": [container], **(spec or {})}}


def test_a_plain_gpu_pod_becomes_a_request_with_its_cpu_and_memory() -> None:
    request = pod_request_from_pod(_pod())
    assert (request.uid, request.namespace, request.name) == ("uid-w0", "ml", "w0")
    assert request.device is not None and request.device.whole and request.device.gpus == 1
    assert (request.cpu_milli, request.memory_bytes) == (2000, 4 * 2**30)
    assert request.job_key == ""


def test_a_pod_without_gpus_has_no_device() -> None:
    assert pod_request_from_pod(_pod(limits={})).device is None


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (_pod(annotations={names.JOB_KEY: "run-7"}, labels={names.POD_GROUP_LABEL: "pg"}), "ml/run-7"),
        (_pod(labels={names.POD_GROUP_LABEL: "pg"}), "ml/pod-group/pg"),
        (_pod(labels={names.POD_GROUP_LABEL_LEGACY: "old"}), "ml/pod-group/old"),
        (
            _pod(
                owners=[
                    {"kind": "Workflow", "uid": "w-1", "controller": False},
                    {"kind": "Job", "uid": "job-1", "controller": True},
                ]
            ),
            "Job/job-1",
        ),
        (_pod(owners=[{"kind": "ReplicaSet", "uid": "rs-1"}]), "ReplicaSet/rs-1"),
        (_pod(owners=[{"kind": "StatefulSet", "uid": "ss-1"}]), ""),
    ],
    ids=[
        "annotation wins",
        "pod-group label",
        "legacy pod-group label",
        "controlling Job",
        "ReplicaSet",
        "not a job",
    ],
)
def test_the_job_key_comes_from_annotation_label_or_owner(pod: dict[str, Any], expected: str) -> None:
    assert pod_request_from_pod(pod).job_key == expected


def _jobset_pod(*, namespace: str, jobset: str, child_job_uid: str, name: str) -> dict[str, Any]:
    # What the JobSet controller makes: a pod owned by one child Job, labelled with the JobSet's name.
    pod = _pod(
        labels={names.JOBSET_NAME_LABEL: jobset},
        owners=[{"kind": "Job", "uid": child_job_uid, "controller": True}],
    )
    pod["metadata"].update(namespace=namespace, name=name, uid=f"uid-{namespace}-{name}")
    return pod


def test_pods_of_different_child_jobs_of_one_jobset_share_a_job_key() -> None:
    leader = pod_request_from_pod(_jobset_pod(namespace="ml", jobset="llm", child_job_uid="job-a", name="l-0"))
    worker = pod_request_from_pod(_jobset_pod(namespace="ml", jobset="llm", child_job_uid="job-b", name="w-0"))
    assert leader.job_key == worker.job_key == "ml/jobset/llm"


def test_jobsets_of_one_name_in_two_namespaces_get_different_job_keys() -> None:
    one = pod_request_from_pod(_jobset_pod(namespace="team-a", jobset="llm", child_job_uid="job-a", name="w-0"))
    two = pod_request_from_pod(_jobset_pod(namespace="team-b", jobset="llm", child_job_uid="job-b", name="w-0"))
    assert one.job_key != two.job_key


def test_a_pod_group_label_wins_over_the_jobset_name() -> None:
    pod = _jobset_pod(namespace="ml", jobset="llm", child_job_uid="job-a", name="w-0")
    pod["metadata"]["labels"][names.POD_GROUP_LABEL] = "gang"
    assert pod_request_from_pod(pod).job_key == "ml/pod-group/gang"


def test_model_lists_are_normalised_to_label_form() -> None:
    request = pod_request_from_pod(
        _pod(
            annotations={
                names.GPU_MODEL_USE: "NVIDIA A100-SXM4-80GB, H100-SXM5-80GB,",
                names.GPU_MODEL_AVOID: "Tesla T4",
            }
        )
    )
    assert request.model_use == {"A100-SXM4-80GB", "H100-SXM5-80GB"}
    assert request.model_avoid == {"T4"}


def test_node_selector_and_required_affinity_are_read() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
                ]
            }
        }
    }
    request = pod_request_from_pod(_pod(spec={"nodeSelector": {"pool": "gpu"}, "affinity": affinity}))
    assert request.node_selector == {"pool": "gpu"}
    assert request.affinity_terms == (
        (LabelRequirement("zone", "In", ("a", "b")),),
        (LabelRequirement("metadata.name", "In", ("n1",)),),
    )


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        (
            _pod(annotations={names.GPU_TOPOLOGY_SCOPE: "rack"}),
            "annotation fgpu.io/gpu-topology-scope: 'rack' is not a topology scope; use one of node, nvlink, pcie, numa",
        ),
        (
            _pod(
                spec={
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["x"]}]}
                                ]
                            }
                        }
                    }
                }
            ),
            "nodeSelectorTerms[0].matchExpressions[0].values: operator Gt needs exactly one integer value, got ['x']",
        ),
        (
            _pod(
                spec={
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {"matchExpressions": [{"key": "gen", "operator": "Near"}]}
                                ]
                            }
                        }
                    }
                }
            ),
            "matchExpressions[0].operator: 'Near' is not one of In, NotIn, Exists, DoesNotExist, Gt, Lt",
        ),
        (_pod(limits={names.GPU_CORE: "50"}), names.GPU_MEMORY),
    ],
    ids=["unknown scope", "Gt with a word", "unknown operator", "share without memory"],
)
def test_bad_input_raises_a_request_error_naming_field_value_and_fix(
    pod: dict[str, Any], message: str
) -> None:
    with pytest.raises(RequestError) as caught:
        pod_request_from_pod(pod)
    assert any(message in error for error in caught.value.errors), caught.value.errors


def test_a_kubernetes_client_pod_reads_the_same_as_its_dict() -> None:
    model = client.V1Pod(
        metadata=client.V1ObjectMeta(
            name="w0", namespace="ml", uid="uid-w0", labels={names.POD_GROUP_LABEL: "pg"}
        ),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="main",
                    resources=client.V1ResourceRequirements(
                        limits={names.NVIDIA_GPU: "1"}, requests={"cpu": "2", "memory": "4Gi"}
                    ),
                )
            ]
        ),
    )
    assert pod_request_from_pod(model) == pod_request_from_pod(_pod(labels={names.POD_GROUP_LABEL: "pg"}))
