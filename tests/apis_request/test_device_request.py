"""DeviceRequest as a value: its invariants, its JSON form, and memory on a given card."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apis.request import DeviceRequest

GI = 2**30


def make(**overrides: Any) -> DeviceRequest:
    fields: dict[str, Any] = dict(gpus=1, core_percent=50, memory_bytes=None, memory_ratio_percent=50, whole=False, source="x")
    fields.update(overrides)
    return DeviceRequest(**fields)


def test_to_json_has_the_documented_shape() -> None:
    assert make().to_json() == {
        "gpus": 1, "core_percent": 50, "memory_bytes": None, "memory_ratio_percent": 50, "whole": False, "source": "x",
    }


def test_json_round_trips_through_text() -> None:
    request = make(memory_bytes=10 * GI, memory_ratio_percent=None, gpus=2)
    assert DeviceRequest.from_json(json.loads(json.dumps(request.to_json()))) == request


IMPOSSIBLE = [
    pytest.param({"gpus": 0}, "gpus: 0 must be at least 1", id="no-gpus"),
    pytest.param({"core_percent": 101}, "core_percent: 101", id="core-over-100"),
    pytest.param({"core_percent": -1}, "core_percent: -1", id="negative-core"),
    pytest.param({"memory_ratio_percent": 0}, "memory_ratio_percent: 0", id="zero-ratio"),
    pytest.param({"memory_bytes": 0, "memory_ratio_percent": None}, "memory_bytes: 0", id="zero-bytes"),
    pytest.param({"memory_bytes": GI}, "not both", id="bytes-and-ratio"),
    pytest.param({"memory_ratio_percent": None}, "one of memory_bytes or memory_ratio_percent", id="no-memory"),
    pytest.param({"whole": True}, "whole=True needs", id="whole-but-half"),
]


@pytest.mark.parametrize(("overrides", "fragment"), IMPOSSIBLE)
def test_an_impossible_request_cannot_be_built(overrides: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        make(**overrides)


BAD_JSON = [
    pytest.param({"core_percent": 50, "memory_ratio_percent": 50}, "gpus: expected a whole number, got None", id="missing-gpus"),
    pytest.param({"gpus": "1", "core_percent": 50, "memory_ratio_percent": 50}, "gpus: expected a whole number", id="gpus-as-text"),
    pytest.param({"gpus": True, "core_percent": 50, "memory_ratio_percent": 50}, "gpus: expected a whole number", id="gpus-bool"),
    pytest.param({"gpus": 1, "core_percent": 50, "memory_ratio_percent": 50, "whole": "no"}, "whole: expected true or false",
                 id="whole-as-text"),
    pytest.param({"gpus": 1, "core_percent": 50, "memory_ratio_percent": 50, "source": 3}, "source: expected text", id="source"),
]


@pytest.mark.parametrize(("data", "fragment"), BAD_JSON)
def test_bad_json_is_rejected_naming_the_field(data: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        DeviceRequest.from_json(data)


def test_memory_on_a_card_comes_from_bytes_or_from_the_ratio() -> None:
    assert make(memory_bytes=10 * GI, memory_ratio_percent=None).memory_bytes_on(80 * GI) == 10 * GI
    assert make(memory_ratio_percent=25).memory_bytes_on(80 * GI) == 20 * GI
    whole = make(core_percent=100, memory_ratio_percent=100, whole=True)
    assert whole.memory_bytes_on(80 * GI + 1) == 80 * GI + 1
