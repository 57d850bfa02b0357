"""Held-out pods against fgpu's admission: fgpu-webhook over real HTTPS and `fgpuctl validate`.

Each pod here is one the authors' tests never tried. The webhook is the real
server (tests/webhook's fixtures: a fresh CA, the Service's DNS name checked as
the API server checks it); `fgpuctl validate` is its command-line entry point
fed the manifest on stdin. The defect tests were written failing (strict xfail)
and their markers removed with the fixes; the rest hold what was checked and works.
"""

from __future__ import annotations

import copy
import io
import json
import re
from collections.abc import Mapping
from typing import Any

import jsonpatch

from apis import names
from fgpuctl.validate import EXIT_INVALID, EXIT_VALID, validate
from tests.webhook import conftest as webhook_fixtures
from tests.webhook.conftest import Served
from tests.webhook.reviews import pod, review
from webhook import review as envelope

# The webhook fixtures, by name: `start_webhook` and `served` (fgpu-webhook on a free port).
start_webhook = webhook_fixtures.start_webhook
served = webhook_fixtures.served

SHARE = {names.GPU_CORE: "50", names.GPU_MEMORY_RATIO: "50"}


def _container(limits: Mapping[str, object] | None = None, *, requests: Mapping[str, object] | None = None,
               name: str = "main") -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = dict(limits)
    if requests is not None:
        resources["requests"] = dict(requests)
    return {"name": name, "image": "nvcr.io/nvidia/pytorch:24.04-py3", "resources": resources}


def _ctl(obj: Mapping[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """`fgpuctl validate -f -` on one manifest: exit status and its output lines."""
    out, err = io.StringIO(), io.StringIO()
    status = validate(files=["-"], rules_path=None, stdin=io.StringIO(json.dumps(obj)), out=out, err=err)
    return status, [json.loads(line) for line in out.getvalue().splitlines()]


def _admit(client: Any, created: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod as stored after /mutate's patch (applied with a real JSON-Patch library), and /validate's answer."""
    mutated = client.post("/mutate", review(created))["response"]
    assert mutated["allowed"] is True
    stored = created
    if "patch" in mutated:
        stored = jsonpatch.apply_patch(created, envelope.decode_patch(mutated["patch"]))
    return stored, client.post("/validate", review(stored))["response"]


# --- defects ----------------------------------------------------------------------------------


def test_hami_memory_in_the_api_servers_canonical_form_is_admitted(served: Served) -> None:
    """`nvidia.com/gpumem: 4000` (examples/pods/valid/hami-share.yaml) reaches admission as "4k".

    The API server re-emits every quantity in canonical form, the largest
    suffix without losing precision (apimachinery's Quantity: "1.5 will be
    serialized as 1500m"), so 4000 is sent as "4k", 8000 as "8k", and the
    Volcano rule's vgpu-memory alike. Pods written exactly as the docs say are
    then refused at apply ("write a plain number of Mi, e.g. 1") and, since the
    scheduler reads the same rules, by the scheduler too.
    """
    client = served.client()
    for limits, mib in (
        ({"nvidia.com/gpumem": "4k", "nvidia.com/gpucores": "30"}, 4000),
        ({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8k"}, 8000),
        ({"volcano.sh/vgpu-memory": "2k", "volcano.sh/vgpu-cores": "50"}, 2000),
    ):
        created = pod(containers=[_container(limits)])
        stored, answer = _admit(client, created)
        assert stored["spec"]["schedulerName"] == names.SCHEDULER_NAME
        assert answer["allowed"] is True, answer["status"]["message"]
        status, lines = _ctl(created)  # a manifest copied with `kubectl get pod -o yaml`
        assert status == EXIT_VALID, lines
        assert lines[0]["request"]["memory_bytes"] == mib * 2**20


def test_fgpuctl_validate_refuses_gpu_requests_without_limits() -> None:
    """Kubernetes refuses an extended resource in requests without limits
    ("Limit must be set for non overcommitable resources"), in a pod and in a
    workload's template alike; `fgpuctl validate` says the pod is valid, so the
    manifest it approved fails at `kubectl apply`.
    """
    bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"containers": [_container(requests=SHARE)]}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "train", "namespace": "ml"},
                  "spec": {"template": {"spec": {"containers": [_container(requests={"nvidia.com/gpu": "1"})]}}}}
    for manifest in (bare, deployment):
        status, lines = _ctl(manifest)
        assert status == EXIT_INVALID, lines
        (line,) = lines
        assert any("limits" in error and 'container "main"' in error for error in line["errors"]), line


def test_a_refusal_of_koordinator_gpu_lists_each_problem_once(served: Served) -> None:
    """`koordinator.sh/gpu: 150` stands for both core and memory ratio; the
    refusal repeats the identical clause once for each, so kubectl prints it twice."""
    created = pod(containers=[_container({names.KOORD_GPU: "150"})])
    _, answer = _admit(served.client(), created)
    assert answer["allowed"] is False
    assert answer["status"]["message"].count(f"{names.KOORD_GPU}=150: is above 100") == 1, answer["status"]["message"]
    _, lines = _ctl(created)
    assert len(lines[0]["errors"]) == len(set(lines[0]["errors"])), lines


def test_the_fix_a_core_alone_refusal_suggests_is_not_refused_itself(served: Served) -> None:
    """`gpu-core: 150` alone is refused with "add koordinator.sh/gpu-memory-ratio
    (e.g. 150)"; the pod with that fix applied is refused for gpu-memory-ratio=150
    (above 100, not a multiple of 100). The first refusal also hides that 150
    itself is not a valid core (the docs promise every problem is listed)."""
    client = served.client()
    created = pod(containers=[_container({names.GPU_CORE: "150"})])
    _, answer = _admit(client, created)
    assert answer["allowed"] is False
    message = answer["status"]["message"]
    suggested = re.search(rf"add {re.escape(names.GPU_MEMORY_RATIO)} \(e\.g\. (\d+)\)", message)
    assert suggested is not None, message
    fixed = copy.deepcopy(created)
    fixed["spec"]["containers"][0]["resources"]["limits"][names.GPU_MEMORY_RATIO] = suggested.group(1)
    _, again = _admit(client, fixed)
    refused_for = again.get("status", {}).get("message", "")
    assert f"{names.GPU_MEMORY_RATIO}=" not in refused_for, refused_for


# --- what works -------------------------------------------------------------------------------


def _held_out_pods() -> list[tuple[str, dict[str, Any]]]:
    sidecar = dict(_container(SHARE, name="proxy"), restartPolicy="Always")
    cases: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]] = [
        ("limits only", [_container(SHARE)], []),
        ("limits and equal requests", [_container(SHARE, requests=SHARE)], []),
        ("requests differ from limits", [_container(SHARE, requests={**SHARE, names.GPU_CORE: "60"})], []),
        ("1000m, 2e0, +1, 01", [_container({names.GPU_CORE: "1000m", names.GPU_MEMORY_RATIO: "2e0"}),
                                _container({names.GPU_CORE: "+1", names.GPU_MEMORY_RATIO: "01"}, name="b")], []),
        ("0.5", [_container({names.GPU_CORE: "0.5", names.GPU_MEMORY_RATIO: "50"})], []),
        ("negative", [_container({"nvidia.com/gpu": "-1"})], []),
        ("huge", [_container({names.GPU_CORE: "99999999999999999999999", names.GPU_MEMORY_RATIO: "50"})], []),
        ("core 150", [_container({names.GPU_CORE: "150", names.GPU_MEMORY_RATIO: "100"})], []),
        ("ratio with memory", [_container({**SHARE, names.GPU_MEMORY: "10Gi"})], []),
        ("whole nvidia and a share", [_container({"nvidia.com/gpu": "1", **SHARE})], []),
        ("two vendors", [_container({"nvidia.com/gpumem": "1000", "volcano.sh/vgpu-memory": "1000"})], []),
        ("qgpu and nvidia", [_container({"tke.cloud.tencent.com/qgpu-core": "50", "nvidia.com/gpu": "1"})], []),
        ("aliyun", [_container({"aliyun.com/gpu-mem": "4"})], []),
        ("hami over 100", [_container({"nvidia.com/gpucores": "150", "nvidia.com/gpumem": "1000"})], []),
        ("init container", [_container({"cpu": "1"})], [_container(SHARE, name="warmup")]),
        ("sidecar", [_container(SHARE)], [sidecar]),
        ("styles across containers", [_container({"nvidia.com/gpu": "1"}), _container(SHARE, name="b")], []),
    ]
    out = []
    for name, containers, init in cases:
        created = pod(containers=containers)
        if init:
            created["spec"]["initContainers"] = init
        out.append((name, created))
    bare = pod(containers=[_container(SHARE)], scheduler=None)
    del bare["metadata"]["labels"]
    out.append(("no labels, annotations or scheduler", bare))
    copied = pod(containers=[_container(SHARE)], annotations={
        names.DEVICE_ALLOCATED: "{}", names.ALLOCATION_SIGNATURE: "s", names.ALLOCATION_NODE: "n", "a~b/c": "kept"})
    out.append(("copied allocation annotations", copied))
    return out


def test_webhook_and_fgpuctl_validate_agree_on_held_out_pods(served: Served) -> None:
    """Over HTTPS: the patch applies, a second /mutate changes nothing, and /validate and
    `fgpuctl validate` give the same verdict with the same lines, each naming the container."""
    client = served.client()
    for name, created in _held_out_pods():
        stored, answer = _admit(client, created)
        assert stored["spec"]["schedulerName"] == names.SCHEDULER_NAME, name
        assert set(stored["metadata"].get("annotations", {})) <= {"a~b/c"}, name
        assert "patch" not in client.post("/mutate", review(stored))["response"], name
        status, (line,) = _ctl(created)
        assert answer["allowed"] is (status == EXIT_VALID), name
        if not answer["allowed"]:
            assert answer["status"]["message"] == "; ".join(line["errors"]), name
            assert all(e.startswith(('container "', 'init container "', "containers ")) for e in line["errors"]), name


def test_fgpuctl_validate_checks_every_workloads_pod_template() -> None:
    bad = {"spec": {"containers": [_container({names.GPU_CORE: "150", names.GPU_MEMORY_RATIO: "50"})]}}
    for kind, spec in (
        ("Deployment", {"template": bad}),
        ("StatefulSet", {"template": bad}),
        ("Job", {"template": bad}),
        ("CronJob", {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": bad}}}),
    ):
        status, lines = _ctl({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": "w", "namespace": "ml"},
                              "spec": spec})
        assert status == EXIT_INVALID and lines[0]["kind"] == kind and lines[0]["pod"] == "ml/w", lines


def test_pods_of_other_schedulers_and_opted_out_pods_are_left_alone(served: Served) -> None:
    client = served.client()
    bad = {names.GPU_CORE: "150"}
    for created in (
        pod(containers=[_container(bad)], scheduler="hami-scheduler"),
        pod(containers=[_container(bad)], labels={names.SCHEDULER_INJECTION_LABEL: "false"}),
    ):
        stored, answer = _admit(client, created)
        assert stored == created
        assert answer["allowed"] is True
