"""How a pod asks for burstable (annotations, as Kubernetes refuses request != limit on extended
resources), the errors `fgpuctl validate` and the webhook print, and the pool's reclaim settings."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest

from agent.errors import ConfigError
from agent.reclaim_settings import SettingsFile, parse
from apis import names
from apis.device_request import Burst, DeviceRequest
from apis.overcommit import tier
from apis.pod_check import check_pod, resources_fingerprint
from apis.translation import TranslationRules

RULES = TranslationRules.default()


def _pod(annotations: dict[str, str], limits: dict[str, str] | None = None, containers: int = 1) -> dict[str, object]:
    limits = limits or {names.GPU_CORE: "30", names.GPU_MEMORY: "8Gi"}
    return {"metadata": {"annotations": annotations}, "spec": {"containers": [
        {"name": f"c{i}", "resources": {"limits": limits}} for i in range(containers)
    ]}}


BURST = {names.GPU_QOS: "burstable", names.GPU_CORE_LIMIT: "80", names.GPU_MEMORY_LIMIT: "20Gi"}


def test_a_burstable_pod_reads_as_its_request_with_a_limit() -> None:
    check = check_pod(_pod(BURST), rules=RULES)
    assert check.valid and check.request is not None and check.request.limit is not None
    assert (check.request.core_percent, check.request.limit.core_percent) == (30, 80)
    assert check.request.limit.memory_bytes == 20 * 2**30


@pytest.mark.parametrize(("annotations", "limits", "containers", "says"), [
    ({names.GPU_QOS: "gold"}, None, 1, "'gold' is not a GPU QoS tier"),
    ({names.GPU_MEMORY_LIMIT: "20Gi"}, None, 1, "add fgpu.io/gpu-qos: burstable"),
    ({names.GPU_QOS: "burstable"}, None, 1, "without a limit"),
    ({**BURST, names.GPU_MEMORY_LIMIT: "4Gi"}, None, 1, "below the request"),
    ({**BURST, names.GPU_CORE_LIMIT: "150"}, None, 1, "between the request"),
    ({**BURST, names.GPU_MEMORY_LIMIT: "1Ei"}, None, 1, "'1Ei' is more memory than any GPU has"),
    (BURST, {names.GPU_CORE: "100", names.GPU_MEMORY_RATIO: "100", names.GPU_SHARED: "2"}, 1, "share of one GPU"),
    (BURST, None, 2, "one container"),
    ({**BURST, names.GPU_MODE: "mig"}, None, 1, "hard partition"),
    ({names.GPU_QOS: "burstable", names.GPU_MEMORY_LIMIT: "20Gi"},
     {names.GPU_CORE: "30", names.GPU_MEMORY_RATIO: "30"}, 1, "write the limit in percent"),
])
def test_each_wrong_form_is_refused_naming_the_annotation_and_the_fix(
    annotations: dict[str, str], limits: dict[str, str] | None, containers: int, says: str
) -> None:
    check = check_pod(_pod(annotations, limits, containers), rules=RULES)
    assert not check.valid
    assert says in check.message


def test_the_check_memo_key_sees_the_burstable_annotations() -> None:
    assert resources_fingerprint(_pod(BURST)) != resources_fingerprint(_pod({}))


def test_settings_refuse_bad_values_naming_the_key_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"highWater=1\.5: expected a number from 0\.5 to 1"):
        parse({"highWater": 1.5}, source="overcommit.yaml")
    with pytest.raises(ConfigError, match=r"unknown key 'ratoi'"):
        parse({"ratoi": 2}, source="overcommit.yaml")
    with pytest.raises(ConfigError, match="cooldown"):
        parse({"cooldown": "soon"}, source="overcommit.yaml")
    settings = parse({"ratio": 1.5, "cooldown": "2m", "evictionGrace": "10s"}, source="x")
    assert (settings.ratio, settings.policy.cooldown_s, settings.policy.eviction_grace_s) == (1.5, 120.0, 10)


@pytest.mark.parametrize(("raw", "says"), [
    ("0s", r"evictionGrace='0s': must be at least 1s .*force-delete.*write e\.g\. 30s"),
    ("500ms", r"evictionGrace='500ms': must be at least 1s"),
    (0, r"evictionGrace=0: must be at least 1s"),
    ("2h", r"evictionGrace='2h': at most 3600s"),
    (float("nan"), r"evictionGrace=nan: not a finite number of seconds; write e\.g\. 30s"),
    ("2x", r"evictionGrace='2x': not a duration"),
])
def test_an_eviction_grace_that_would_force_delete_or_never_end_is_refused(raw: object, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse({"evictionGrace": raw}, source="overcommit.yaml")


def test_an_eviction_grace_is_30s_when_absent_and_rounded_up_to_whole_seconds() -> None:
    assert parse({"ratio": 1.5}, source="x").policy.eviction_grace_s == 30
    assert parse(None, source="x").policy.eviction_grace_s == 30
    assert parse({"evictionGrace": "1.2s"}, source="x").policy.eviction_grace_s == 2


def test_a_reload_with_a_typo_keeps_the_settings_in_force(tmp_path: Path) -> None:
    path = tmp_path / "overcommit.yaml"
    path.write_text("highWater: 0.9\ncooldown: 10s\n")
    watched = SettingsFile(str(path))
    assert watched.reload() and watched.current.policy.high_water == 0.9
    path.write_text("highWater: lots\n")
    os.utime(path, (1, 1))
    assert not watched.reload()
    assert watched.current.policy.high_water == 0.9 and "highWater='lots'" in watched.error
    path.write_text("highWater: 0.8\n")
    os.utime(path, (2, 2))
    assert watched.reload() and watched.current.policy.high_water == 0.8 and not watched.error


@pytest.mark.parametrize("request_", [
    DeviceRequest(gpus=1, core_percent=30, memory_bytes=8 * 2**30, memory_ratio_percent=None, whole=False,
                  source="koordinator", limit=Burst(core_percent=80, memory_bytes=20 * 2**30, memory_ratio_percent=None)),
    DeviceRequest(gpus=1, core_percent=25, memory_bytes=None, memory_ratio_percent=20, whole=False, source="hami",
                  limit=Burst(core_percent=25, memory_bytes=None, memory_ratio_percent=60)),
    DeviceRequest(gpus=2, core_percent=100, memory_bytes=None, memory_ratio_percent=100, whole=True, source="nvidia"),
], ids=["burstable-bytes", "burstable-ratio", "guaranteed-whole"])
def test_a_request_survives_json_text_with_every_field_and_its_tier(request_: DeviceRequest) -> None:
    back = DeviceRequest.from_json(json.loads(json.dumps(request_.to_json())))
    for field in dataclasses.fields(DeviceRequest):  # every field, the limit (the tier) included
        assert getattr(back, field.name) == getattr(request_, field.name), field.name
    assert tier(back) == tier(request_)


def test_a_request_parsed_from_a_burstable_pod_round_trips_with_its_limit() -> None:
    check = check_pod(_pod(BURST), rules=RULES)
    assert check.request is not None and check.request.limit is not None
    assert DeviceRequest.from_json(json.loads(json.dumps(check.request.to_json()))) == check.request


@pytest.mark.parametrize(("limit", "says"), [
    ({"core_percent": 10, "memory_bytes": 20 * 2**30, "memory_ratio_percent": None}, "limit.core_percent: 10"),
    ({"core_percent": 80, "memory_bytes": 2**30, "memory_ratio_percent": None}, "at least the request's"),
    ({"core_percent": 80, "memory_bytes": None, "memory_ratio_percent": 50}, "no ratio, beside a bytes request"),
    ("80", "limit: expected an object or null"),
])
def test_a_json_limit_that_breaks_the_rule_is_refused_naming_the_field(limit: object, says: str) -> None:
    data = {"gpus": 1, "core_percent": 30, "memory_bytes": 8 * 2**30, "memory_ratio_percent": None, "whole": False,
            "source": "koordinator", "limit": limit}
    with pytest.raises(ValueError, match=re.escape(says)):
        DeviceRequest.from_json(data)
