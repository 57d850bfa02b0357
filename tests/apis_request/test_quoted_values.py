"""Annotation errors repeat the pod author's value quoted, escaped and cut short (apis/quoting.py)."""

from __future__ import annotations

from typing import Any

import pytest

from apis import names, pod_check
from apis.mig import MIGRequestError, mig_mode
from apis.quoting import SHOWN_MAX, quoted
from apis.translation import TranslationRules

_CONTROL = ("\x1b", "\x07", "\r", "\n", "\x9b", "\u202e", "\xa0")


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("rack", "'rack'"),
        ("a\x1b[2Jb", "'a\\x1b[2Jb'"),
        ("\u202eevil\r", "'\\u202eevil\\r'"),
        ("y" * (SHOWN_MAX + 1), repr("y" * SHOWN_MAX) + "..."),
        ("y" * SHOWN_MAX, repr("y" * SHOWN_MAX)),
    ],
)
def test_quoted_escapes_and_cuts(value: str, shown: str) -> None:
    assert quoted(value) == shown


def test_a_bad_gpu_mode_is_quoted_cut_short() -> None:
    with pytest.raises(MIGRequestError) as raised:
        mig_mode({names.GPU_MODE: "\x1b]0;x\x07" + "y" * 100_000})
    text = str(raised.value)
    assert text.startswith(f"annotation {names.GPU_MODE}='\\x1b]0;x\\x07yyy")
    assert len(text) < 400 and not [c for c in _CONTROL if c in text]


def _pod(annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "team", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {names.GPU_CORE: "50", names.GPU_MEMORY: "4Gi"}}}]},
    }


@pytest.mark.parametrize(
    "annotations",
    [
        {names.GPU_QOS: "\r\x1b[2K" + "q" * 50_000},
        {names.GPU_CORE_LIMIT: "\r\x1b[2K" + "9" * 50_000},  # a limit on a pod that is not burstable
        {names.GPU_QOS: names.GPU_QOS_BURSTABLE, names.GPU_CORE_LIMIT: "\r" + "9" * 50_000},
        {names.GPU_QOS: names.GPU_QOS_BURSTABLE, names.GPU_MEMORY_LIMIT: "\x1b" + "9" * 50_000},
        {names.GPU_QOS: names.GPU_QOS_BURSTABLE, names.GPU_MEMORY_RATIO_LIMIT: "\x9b" + "9" * 50_000},
    ],
)
def test_qos_and_limit_errors_quote_the_value_cut_short(annotations: dict[str, str]) -> None:
    verdict = pod_check.check_pod(_pod(annotations), rules=TranslationRules.default())
    assert not verdict.valid
    for error in verdict.errors:
        assert len(error) < 600, error[:200]
        assert not [c for c in _CONTROL if c in error], error[:200]
    assert any("..." in e for e in verdict.errors)
