"""The mutating decision over whole pods: the patch, applied by a real JSONPatch library, gives the expected pod."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from apis import names
from apis.translation import TranslationRules
from tests.webhook.reviews import Pod, pod
from webhook import patches
from webhook.mutating import SCHEDULER_ANNOTATIONS, mutate_pod
from webhook.reading import MemoReader
from webhook.review import Verdict
from webhook.scope import LabelSelector, Operator, Requirement, Scope

RULES = TranslationRules.default()
ACME_RULES = TranslationRules.from_yaml(
    "version: 1\nrules:\n  - name: acme\n    count: {resource: acme.example/vgpu}\n", origin="acme.yaml"
)


def mutate(p: Pod, *, scope: Scope = Scope(), rules: TranslationRules = RULES, namespace: str | None = None) -> Verdict:
    return mutate_pod(p, namespace=namespace or p["metadata"]["namespace"], scope=scope, rules=rules)


def patched(p: Pod, verdict: Verdict) -> Pod:
    result = jsonpatch.apply_patch(p, [dict(op) for op in verdict.patch])
    assert isinstance(result, dict)
    return result


def with_scheduler(p: Pod, name: str) -> Pod:
    out = copy.deepcopy(p)
    out["spec"]["schedulerName"] = name
    return out


GPU_PODS = [
    pytest.param({names.GPU_CORE: "50", names.GPU_MEMORY_RATIO: "50"}, id="koordinator-share"),
    pytest.param({names.GPU_CORE: 50, names.GPU_MEMORY: "10Gi"}, id="koordinator-core-and-bytes"),
    pytest.param({names.KOORD_GPU: "100"}, id="koordinator-gpu"),
    pytest.param({names.NVIDIA_GPU: 2}, id="nvidia-whole"),
    pytest.param({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000, "nvidia.com/gpucores": 30}, id="hami"),
    pytest.param({"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 2048}, id="volcano"),
    pytest.param({"aliyun.com/gpu-mem": 8}, id="aliyun"),
    pytest.param({"tke.cloud.tencent.com/qgpu-core": 50, "tke.cloud.tencent.com/qgpu-memory": 4}, id="qgpu"),
    pytest.param({names.GPU_CORE: "150", names.GPU_MEMORY_RATIO: "150"}, id="invalid-still-routed-to-fgpu"),
]


@pytest.mark.parametrize("resources", GPU_PODS)
def test_a_gpu_pod_naming_the_default_scheduler_gets_fgpu_scheduler_and_nothing_else(resources: dict[str, Any]) -> None:
    p = pod(resources=resources)
    verdict = mutate(p)
    assert verdict.allowed
    assert list(verdict.patch) == [{"op": "replace", "path": "/spec/schedulerName", "value": names.SCHEDULER_NAME}]
    assert patched(p, verdict) == with_scheduler(p, names.SCHEDULER_NAME)
    (warning,) = verdict.warnings
    assert warning.startswith("fgpu: set spec.schedulerName to fgpu-scheduler (was default-scheduler): the pod asks for ")


def test_a_gpu_pod_without_a_scheduler_name_gets_one_added() -> None:
    p = pod(resources={names.NVIDIA_GPU: 1}, scheduler=None)
    verdict = mutate(p)
    assert list(verdict.patch) == [{"op": "add", "path": "/spec/schedulerName", "value": names.SCHEDULER_NAME}]
    assert patched(p, verdict) == with_scheduler(p, names.SCHEDULER_NAME)
    assert "(was unset)" in verdict.warnings[0]


def test_a_gpu_request_in_an_init_container_counts() -> None:
    p = pod()
    p["spec"]["initContainers"] = [{"name": "warmup", "image": "busybox", "resources": {"limits": {names.NVIDIA_GPU: 1}}}]
    assert patched(p, mutate(p)) == with_scheduler(p, names.SCHEDULER_NAME)


@pytest.mark.parametrize(
    "resources",
    [
        pytest.param({}, id="no-resources"),
        pytest.param({"cpu": "2", "memory": "8Gi"}, id="cpu-only"),
        pytest.param({names.GPU_CORE: "0", names.GPU_MEMORY_RATIO: 0}, id="gpu-written-as-zero"),
        pytest.param({names.NVIDIA_GPU: "0"}, id="nvidia-zero"),
        pytest.param({"nvidia.com/mig-1g.10gb": 1}, id="mig-is-the-device-plugins"),
        pytest.param({"example.com/rdma": 1}, id="unknown-extended-resource"),
    ],
)
def test_a_pod_that_asks_for_no_gpu_is_left_alone(resources: dict[str, Any]) -> None:
    verdict = mutate(pod(resources=resources))
    assert verdict == Verdict()


@pytest.mark.parametrize("scheduler", ["koord-scheduler", "hami-scheduler", "volcano", names.SCHEDULER_NAME])
def test_a_pod_that_names_a_scheduler_keeps_it(scheduler: str) -> None:
    assert mutate(pod(resources={names.NVIDIA_GPU: 1}, scheduler=scheduler)) == Verdict()


def test_the_translation_rules_decide_which_vendor_resources_are_gpus() -> None:
    p = pod(resources={"acme.example/vgpu": 2})
    assert mutate(p).patch == ()
    assert patched(p, mutate(p, rules=ACME_RULES)) == with_scheduler(p, names.SCHEDULER_NAME)


def test_the_opt_out_label_keeps_the_default_scheduler() -> None:
    p = pod(resources={names.NVIDIA_GPU: 1}, labels={names.SCHEDULER_INJECTION_LABEL: "false"})
    assert mutate(p) == Verdict()
    other_value = pod(resources={names.NVIDIA_GPU: 1}, labels={names.SCHEDULER_INJECTION_LABEL: "true"})
    assert mutate(other_value).patch != ()


SELECT_ML = Scope(namespaces=frozenset({"ml"}))
SCOPES = [
    pytest.param(SELECT_ML, "ml", {}, True, id="listed-namespace"),
    pytest.param(SELECT_ML, "web", {}, False, id="unlisted-namespace"),
    pytest.param(Scope(exclude_namespaces=frozenset({"ml"})), "ml", {}, False, id="excluded-namespace"),
    pytest.param(Scope(pod_selector=LabelSelector((Requirement("team", Operator.IN, frozenset({"a", "b"})),))),
                 "ml", {"team": "b"}, True, id="selector-in"),
    pytest.param(Scope(pod_selector=LabelSelector((Requirement("team", Operator.IN, frozenset({"a"})),))),
                 "ml", {"team": "b"}, False, id="selector-in-other-value"),
    pytest.param(Scope(pod_selector=LabelSelector((Requirement("team", Operator.NOT_IN, frozenset({"a"})),))),
                 "ml", {}, True, id="selector-not-in-absent"),
    pytest.param(Scope(pod_selector=LabelSelector((Requirement("gpu", Operator.EXISTS),))), "ml", {}, False,
                 id="selector-exists"),
    pytest.param(Scope(pod_selector=LabelSelector((Requirement("legacy", Operator.DOES_NOT_EXIST),))),
                 "ml", {"legacy": ""}, False, id="selector-does-not-exist"),
    pytest.param(Scope(enabled=False), "ml", {}, False, id="disabled"),
]


@pytest.mark.parametrize(("scope", "namespace", "labels", "injected"), SCOPES)
def test_the_scope_limits_where_the_scheduler_name_is_set(
    scope: Scope, namespace: str, labels: dict[str, str], injected: bool
) -> None:
    p = pod(resources={names.NVIDIA_GPU: 1}, namespace=namespace, labels=labels)
    assert bool(mutate(p, scope=scope).patch) is injected


def test_allocation_annotations_are_removed_wherever_the_pod_is_and_others_kept() -> None:
    annotations = {key: "copied" for key in SCHEDULER_ANNOTATIONS}
    annotations["team.example/owner"] = "ml-infra"
    p = pod(resources={"cpu": "1"}, annotations=annotations, labels={names.SCHEDULER_INJECTION_LABEL: "false"})
    verdict = mutate(p, scope=Scope(enabled=False))
    assert list(verdict.patch) == [
        {"op": "remove", "path": "/metadata/annotations/scheduling.koordinator.sh~1device-allocated"},
        {"op": "remove", "path": "/metadata/annotations/fgpu.io~1allocation-signature"},
        {"op": "remove", "path": "/metadata/annotations/fgpu.io~1allocation-node"},
    ]
    expected = copy.deepcopy(p)
    expected["metadata"]["annotations"] = {"team.example/owner": "ml-infra"}
    assert patched(p, verdict) == expected
    assert len(verdict.warnings) == 3
    assert all(w.startswith("fgpu: removed annotation ") for w in verdict.warnings)


def test_both_changes_come_in_one_patch_with_a_warning_each() -> None:
    p = pod(resources={names.NVIDIA_GPU: 1}, annotations={names.ALLOCATION_NODE: "gpu-node-3"})
    verdict = mutate(p)
    expected = with_scheduler(p, names.SCHEDULER_NAME)
    expected["metadata"]["annotations"] = {}
    assert patched(p, verdict) == expected
    assert len(verdict.warnings) == 2


def test_every_warning_is_one_line_the_api_server_passes_on_whole() -> None:
    many = {f"acme.example/r{i}": 1 for i in range(8)}
    rules = TranslationRules.from_yaml(
        "version: 1\nrules:\n" + "".join(
            f"  - name: r{i}\n    count: {{resource: acme.example/r{i}}}\n" for i in range(8)
        )
    )
    p = pod(resources=many, annotations=dict.fromkeys(SCHEDULER_ANNOTATIONS, "x"))
    verdict = mutate(p, rules=rules)
    assert verdict.warnings
    assert all(len(w) <= 256 and "\n" not in w for w in verdict.warnings)
    assert "and 6 more" in verdict.warnings[-1]


@pytest.mark.parametrize(
    ("token", "escaped"),
    [("a/b", "a~1b"), ("a~b", "a~0b"), ("~/", "~0~1"), ("~1", "~01"), ("plain", "plain")],
)
def test_pointer_tokens_escape_tilde_before_slash(token: str, escaped: str) -> None:
    assert patches.escape(token) == escaped
    document = {"metadata": {"annotations": {token: "v", "other": "w"}}}
    result = jsonpatch.apply_patch(document, [patches.remove(patches.pointer("metadata", "annotations", token))])
    assert result == {"metadata": {"annotations": {"other": "w"}}}


@pytest.mark.parametrize(
    "broken",
    [
        {"kind": "Pod"},
        {"metadata": "x", "spec": {"containers": "not a list"}},
        {"metadata": {"annotations": ["a"]}, "spec": {"containers": [1, 2]}},
        {"spec": {"containers": [{"name": "c", "resources": {"limits": "x"}}]}},
    ],
)
def test_an_oddly_shaped_pod_gets_no_patch_rather_than_a_crash(broken: dict[str, Any]) -> None:
    assert mutate_pod(broken, namespace="ml", scope=Scope(), rules=RULES).patch == ()


def test_the_memo_reads_replicas_once_and_answers_as_the_direct_reading() -> None:
    memo = MemoReader(size=4)
    replicas = [pod(resources={names.GPU_CORE: "50", names.GPU_MEMORY_RATIO: "50"}) for _ in range(20)]
    for p in replicas:
        assert mutate_pod(p, namespace="ml", scope=Scope(), rules=RULES, reader=memo) == mutate(p)
    assert (memo.hits, memo.misses) == (19, 1)
    reloaded = TranslationRules(RULES.rules)  # a new rules object (a reload): nothing is carried over
    mutate_pod(replicas[0], namespace="ml", scope=Scope(), rules=reloaded, reader=memo)
    assert memo.misses == 2
