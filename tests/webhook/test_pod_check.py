"""apis/pod_check.py, the one check `fgpuctl validate` prints and the webhook enforces."""

from __future__ import annotations

import copy

import pytest

from apis import names, pod_check
from apis.translation import TranslationRules
from fgpuctl.validate import Manifest, check
from tests.webhook.examples import INVALID, VALID
from tests.webhook.reviews import pod

RULES = TranslationRules.default()


@pytest.mark.parametrize("p", INVALID + VALID, ids=[p["metadata"]["name"] for p in INVALID + VALID])
def test_fgpuctl_validate_prints_the_shared_check(p: dict[str, object]) -> None:
    verdict = pod_check.check_pod(p, rules=RULES)
    line = check(Manifest(key="k", kind="Pod", pod=p), rules=RULES)
    if verdict.valid:
        assert line == {"pod": "k", "valid": True,
                        "request": verdict.request.to_json() if verdict.request is not None else None}
    else:
        assert line == {"pod": "k", "valid": False, "errors": list(verdict.errors)}
        assert verdict.message == "; ".join(verdict.errors)


def test_gpu_and_cpu_problems_are_reported_together() -> None:
    p = pod(resources={names.GPU_CORE: "-1", "cpu": "fast"})
    errors = pod_check.check_pod(p, rules=RULES).errors
    assert [e.split(":")[0] for e in errors] == ['container "main"', 'container "main"']
    assert "gpu-core=-1" in errors[0] and "cpu=fast" in errors[1]


@pytest.mark.parametrize(
    ("limits", "requests", "expected"),
    [
        ({names.GPU_CORE: "50", "cpu": "1"}, None, (names.GPU_CORE,)),
        ({names.GPU_CORE: "0"}, None, ()),
        ({names.GPU_CORE: "0"}, {names.GPU_CORE: "1"}, (names.GPU_CORE,)),
        ({names.NVIDIA_GPU: "x"}, None, (names.NVIDIA_GPU,)),
        ({"nvidia.com/gpumem": 1000, names.NVIDIA_GPU: 1}, None, ("nvidia.com/gpu", "nvidia.com/gpumem")),
        ({"nvidia.com/mig-1g.10gb": 1, "example.com/rdma": 1}, None, ()),
    ],
)
def test_gpu_resources_names_what_the_pod_asks_for_in_any_known_style(
    limits: dict[str, object], requests: dict[str, object] | None, expected: tuple[str, ...]
) -> None:
    p = pod()
    p["spec"]["containers"][0]["resources"] = {"limits": limits, **({"requests": requests} if requests else {})}
    assert pod_check.gpu_resources(p, rules=RULES) == expected


def test_equal_fingerprints_mean_equal_checks_and_only_the_resources_count() -> None:
    a = pod(resources={names.GPU_CORE: "50", names.GPU_MEMORY_RATIO: "50"})
    b = copy.deepcopy(a)
    b["metadata"]["labels"]["other"] = "pod"
    b["spec"]["containers"][0]["image"] = "another:image"
    assert pod_check.resources_fingerprint(a) == pod_check.resources_fingerprint(b)
    renamed = copy.deepcopy(a)
    renamed["spec"]["containers"][0]["name"] = "worker"  # the name is in the messages
    assert pod_check.resources_fingerprint(a) != pod_check.resources_fingerprint(renamed)


@pytest.mark.parametrize(("one", "other"), [("50", 50), (1, True), (1, 1.0), ("1", "1.0")])
def test_values_that_read_differently_never_share_a_fingerprint(one: object, other: object) -> None:
    a, b = pod(resources={names.GPU_CORE: one}), pod(resources={names.GPU_CORE: other})
    assert pod_check.resources_fingerprint(a) != pod_check.resources_fingerprint(b)


def test_a_pod_not_shaped_like_one_has_no_fingerprint() -> None:
    assert pod_check.resources_fingerprint({"spec": {"containers": "x"}}) is None
    assert pod_check.resources_fingerprint({"spec": [1]}) is None
