"""`fgpuctl validate` refuses a bad model, topology or job-key annotation with the scheduler's own line."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import yaml

from apis import names
from apis.pod_annotations import JOB_KEY_MAX, TOPOLOGY_SCOPES
from apis.pod_check import check_pod, resources_fingerprint
from apis.request import RequestError
from apis.translation import TranslationRules
from fgpuctl import validate
from scheduler_plugin.core.filtering import SCOPES
from scheduler_plugin.core.podrequest import pod_request_from_pod

RULES = TranslationRules.default()
TOO_LONG = "k" * (JOB_KEY_MAX + 1)


def pod(annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": {names.NVIDIA_GPU: 2}}}]},
    }


def validate_text(text: str) -> tuple[int, list[dict[str, Any]]]:
    out, err = io.StringIO(), io.StringIO()
    code = validate.validate(files=["-"], rules_path=None, stdin=io.StringIO(text), out=out, err=err)
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


def scheduler_errors(manifest: dict[str, Any]) -> list[str]:
    with pytest.raises(RequestError) as caught:
        pod_request_from_pod(manifest)
    return caught.value.errors


@pytest.mark.parametrize(
    ("annotations", "error"),
    [
        ({names.GPU_MODEL_USE: "A100-SXM4-80GB,***"},
         "annotation fgpu.io/gpu-model-use: '***' is not a GPU model; write models such as A100-SXM4-80GB,T4, as the "
         "node label node.koordinator.sh/gpu-model has them (kubectl fgpu inspect lists the cluster's)"),
        ({names.GPU_MODEL_AVOID: "T4, --"},
         "annotation fgpu.io/gpu-model-avoid: '--' is not a GPU model; write models such as A100-SXM4-80GB,T4, as the "
         "node label node.koordinator.sh/gpu-model has them (kubectl fgpu inspect lists the cluster's)"),
        ({names.GPU_MODEL_USE: "T4,A100-SXM4-80GB", names.GPU_MODEL_AVOID: "Tesla T4"},
         "annotation fgpu.io/gpu-model-avoid: 'T4' is also in fgpu.io/gpu-model-use; a model cannot be both used and "
         "avoided: drop it from one of the two"),
        ({names.GPU_TOPOLOGY_SCOPE: "rack"},
         "annotation fgpu.io/gpu-topology-scope: 'rack' is not a topology scope; use one of node, nvlink, pcie, numa"),
        ({names.JOB_KEY: TOO_LONG},
         f"annotation fgpu.io/job-key: '{'k' * 64}'... is {JOB_KEY_MAX + 1} characters long; a job key is at most "
         f"{JOB_KEY_MAX} characters: use a short name for the job, such as rl-run-7"),
        ({names.JOB_KEY: "run-7\x1b[2Jrun-8"},
         "annotation fgpu.io/job-key: 'run-7\\x1b[2Jrun-8' holds a line break or another control character; write "
         "the key on one line in printable characters, such as rl-run-7"),
    ],
    ids=["model not a name", "avoid not a name", "used and avoided", "unknown scope", "long job key", "escape in job key"],
)
def test_a_bad_placement_annotation_is_refused_by_validate_and_the_scheduler_alike(
    annotations: dict[str, str], error: str
) -> None:
    manifest = pod(annotations)
    code, lines = validate_text(yaml.safe_dump(manifest))
    assert code == validate.EXIT_INVALID
    assert lines[0]["errors"] == [error]
    assert scheduler_errors(manifest) == [error]


def test_every_problem_is_listed_beside_the_resource_errors() -> None:
    manifest = pod({names.GPU_TOPOLOGY_SCOPE: "rack", names.GPU_MODEL_USE: "***"})
    manifest["spec"]["containers"][0]["resources"]["limits"] = {names.GPU_CORE: "150", names.GPU_MEMORY_RATIO: "50"}
    errors = check_pod(manifest, rules=RULES).errors
    assert [e.split(":")[0] for e in errors] == [
        'container "main"', "annotation fgpu.io/gpu-model-use", "annotation fgpu.io/gpu-topology-scope",
    ]
    assert sorted(scheduler_errors(manifest)) == sorted(errors)


def test_a_workloads_pod_template_is_checked_too() -> None:
    job = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"template": {
            "metadata": {"annotations": {names.GPU_TOPOLOGY_SCOPE: "rack"}},
            "spec": {"restartPolicy": "Never", "containers": [
                {"name": "main", "image": "x", "resources": {"limits": {names.NVIDIA_GPU: 4}}}]},
        }},
    }
    code, lines = validate_text(yaml.safe_dump(job))
    assert code == validate.EXIT_INVALID
    assert lines[0]["pod"] == "ml/train" and lines[0]["errors"][0].startswith("annotation fgpu.io/gpu-topology-scope: 'rack'")


@pytest.mark.parametrize(
    "annotations",
    [
        {names.GPU_MODEL_USE: "NVIDIA A100-SXM4-80GB, H100-SXM5-80GB,", names.GPU_MODEL_AVOID: "Tesla T4"},
        {names.GPU_MODEL_USE: "", names.GPU_MODEL_AVOID: " , "},
        {names.GPU_TOPOLOGY_SCOPE: " NVLink "},
        {names.GPU_TOPOLOGY_SCOPE: ""},
        {names.JOB_KEY: "k" * JOB_KEY_MAX},
        {names.JOB_KEY: "  rl run 7 (actors) \n"},
    ],
    ids=["nvml spellings", "blank lists", "scope in capitals", "blank scope", "longest job key", "job key with spaces"],
)
def test_valid_and_blank_annotations_pass_validate_and_the_scheduler(annotations: dict[str, str]) -> None:
    manifest = pod(annotations)
    code, lines = validate_text(yaml.safe_dump(manifest))
    assert code == validate.EXIT_VALID, lines
    pod_request_from_pod(manifest)


def test_the_scheduler_reads_the_checked_values() -> None:
    request = pod_request_from_pod(pod({
        names.GPU_MODEL_USE: "NVIDIA A100-SXM4-80GB", names.GPU_TOPOLOGY_SCOPE: "NUMA", names.JOB_KEY: " rl-run-7 ",
    }))
    assert (request.model_use, request.topology_scope, request.job_key) == (frozenset({"A100-SXM4-80GB"}), "numa", "ml/rl-run-7")


def test_the_checked_scopes_are_the_ones_the_scheduler_filters_by() -> None:
    assert set(SCOPES) == {"", *TOPOLOGY_SCOPES}


@pytest.mark.parametrize("key", [names.GPU_MODEL_USE, names.GPU_MODEL_AVOID, names.GPU_TOPOLOGY_SCOPE, names.JOB_KEY])
def test_each_placement_annotation_is_part_of_what_the_webhook_memoizes_by(key: str) -> None:
    assert resources_fingerprint(pod({key: "rack"})) != resources_fingerprint(pod({key: "nvlink"}))
    assert resources_fingerprint(pod({key: "T4"})) == resources_fingerprint(pod({key: "T4"}))
