"""Over real HTTPS, the validating webhook refuses a bad model, topology or job-key annotation with
the line `fgpuctl validate` prints and the scheduler would leave on a Pending pod."""

from __future__ import annotations

import io
import json

import jsonpatch
import pytest
import yaml

from apis import names
from apis.request import RequestError
from fgpuctl import validate
from scheduler_plugin.core.podrequest import pod_request_from_pod
from tests.webhook.conftest import Served
from tests.webhook.reviews import Pod, pod, review
from webhook import review as envelope

SHARE = {names.GPU_CORE: "50", names.GPU_MEMORY_RATIO: "50"}
TOPOLOGY = "annotation fgpu.io/gpu-topology-scope: 'rack' is not a topology scope; use one of node, nvlink, pcie, numa"


def validate_errors(manifest: Pod) -> list[str]:
    out, err = io.StringIO(), io.StringIO()
    code = validate.validate(files=["-"], rules_path=None, stdin=io.StringIO(yaml.safe_dump(manifest)), out=out, err=err)
    assert code == validate.EXIT_INVALID, out.getvalue() + err.getvalue()
    errors: list[str] = json.loads(out.getvalue())["errors"]
    return errors


def scheduler_errors(manifest: Pod) -> list[str]:
    with pytest.raises(RequestError) as caught:
        pod_request_from_pod(manifest)
    return caught.value.errors


@pytest.mark.parametrize(
    "annotations",
    [
        {names.GPU_TOPOLOGY_SCOPE: "rack"},
        {names.GPU_MODEL_USE: "A100-SXM4-80GB,***"},
        {names.GPU_MODEL_USE: "T4", names.GPU_MODEL_AVOID: "T4"},
        {names.JOB_KEY: "run\n7"},
    ],
    ids=["topology", "model", "used-and-avoided", "job-key"],
)
def test_a_bad_placement_annotation_is_refused_with_the_message_validate_and_the_scheduler_give(
    served: Served, annotations: dict[str, str]
) -> None:
    bad = pod(resources=SHARE, annotations=annotations, scheduler=names.SCHEDULER_NAME)
    response = served.client().post("/validate", review(bad))["response"]
    assert response["allowed"] is False
    assert (response["status"]["code"], response["status"]["reason"]) == (403, "Forbidden")
    assert response["status"]["message"] == "; ".join(validate_errors(bad))
    assert response["status"]["message"] == "; ".join(scheduler_errors(bad))
    assert response["status"]["message"].startswith("annotation fgpu.io/")


def test_a_gpu_pod_without_a_scheduler_gets_fgpu_scheduler_and_then_the_refusal(served: Served) -> None:
    created = pod(resources=SHARE, annotations={names.GPU_TOPOLOGY_SCOPE: "rack"})
    client = served.client()
    mutated = client.post("/mutate", review(created))["response"]
    assert mutated["allowed"] is True
    stored = jsonpatch.apply_patch(created, envelope.decode_patch(mutated["patch"]))
    assert stored["spec"]["schedulerName"] == names.SCHEDULER_NAME
    response = client.post("/validate", review(stored))["response"]
    assert (response["allowed"], response["status"]["message"]) == (False, TOPOLOGY)


def test_replicas_that_differ_only_in_the_annotation_are_each_judged_on_their_own(served: Served) -> None:
    """The webhook memoizes verdicts by pod shape: the annotation must be part of the shape."""
    client = served.client()
    good = pod(resources=SHARE, annotations={names.GPU_TOPOLOGY_SCOPE: "nvlink"}, scheduler=names.SCHEDULER_NAME)
    bad = pod(resources=SHARE, annotations={names.GPU_TOPOLOGY_SCOPE: "rack"}, scheduler=names.SCHEDULER_NAME)
    for _ in range(2):
        assert client.post("/validate", review(good))["response"]["allowed"] is True
        response = client.post("/validate", review(bad))["response"]
        assert (response["allowed"], response["status"]["message"]) == (False, TOPOLOGY)


def test_another_schedulers_pod_passes_whatever_its_annotations_say(served: Served) -> None:
    other = pod(resources={names.NVIDIA_GPU: "1"}, annotations={names.GPU_TOPOLOGY_SCOPE: "rack"}, scheduler="volcano")
    assert served.client().post("/validate", review(other))["response"]["allowed"] is True
