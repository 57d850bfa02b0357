"""`fgpuctl validate` and the webhook refuse a `fgpu.io/gpu-mode` they cannot honour, with the scheduler's words."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import yaml

from apis import names
from apis.pod_check import check_pod, resources_fingerprint
from apis.request import RequestError
from apis.translation import TranslationRules
from fgpuctl import validate
from scheduler_plugin.core.podrequest import pod_request_from_pod

RULES = TranslationRules.default()


def pod(mode: str | None, limits: dict[str, Any]) -> dict[str, Any]:
    annotations = {names.GPU_MODE: mode} if mode is not None else {}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]},
    }


SHARE = {names.GPU_CORE: 30, names.GPU_MEMORY: "20Gi"}


@pytest.mark.parametrize(
    ("mode", "limits", "error"),
    [
        ("Mig", SHARE, "annotation fgpu.io/gpu-mode='Mig' is not a GPU mode; write 'mig' (a MIG instance only), "
                       "'shared' (never MIG) or leave it out (either)"),
        ("mig", {names.NVIDIA_GPU: 2}, "annotation fgpu.io/gpu-mode='mig' asks for a MIG instance, but the pod asks "
                                       "for whole GPUs; drop the annotation, or ask for a share (koordinator.sh/gpu-memory) "
                                       "that a MIG profile holds"),
    ],
)
def test_a_bad_gpu_mode_is_refused_by_validate_and_the_scheduler_alike(
    mode: str, limits: dict[str, Any], error: str
) -> None:
    manifest = pod(mode, limits)
    out, err = io.StringIO(), io.StringIO()

    code = validate.validate(files=["-"], rules_path=None, stdin=io.StringIO(yaml.safe_dump(manifest)), out=out, err=err)

    assert code == validate.EXIT_INVALID
    assert json.loads(out.getvalue())["errors"] == [error]
    with pytest.raises(RequestError) as caught:
        pod_request_from_pod(manifest)
    assert caught.value.errors == [error]


@pytest.mark.parametrize("mode", [None, "mig", "shared"])
def test_a_valid_gpu_mode_passes(mode: str | None) -> None:
    assert check_pod(pod(mode, SHARE), rules=RULES).valid


def test_the_mode_is_part_of_what_the_webhook_memoizes_by() -> None:
    assert resources_fingerprint(pod("mig", SHARE)) != resources_fingerprint(pod("bad", SHARE))
    assert resources_fingerprint(pod(None, SHARE)) == resources_fingerprint(pod(None, SHARE))
