"""The agent's NVML surface exists, with the same parameters, in the real pynvml and in the fake."""

from __future__ import annotations

import inspect

import pynvml
import pytest

from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import load_inventory
from agent.nvmlapi import NVML, cuda_version_text, error_text
from tests.agent.helpers import T4

METHODS = sorted(
    name for name, value in vars(NVML).items() if name.startswith("nvml") and callable(value)
)


def _positional(func: object) -> list[str]:
    params = inspect.signature(func).parameters.values()  # type: ignore[arg-type]
    return [p.name for p in params if p.default is inspect.Parameter.empty and p.name != "self"]


@pytest.mark.parametrize("name", METHODS)
def test_every_call_the_agent_makes_exists_in_the_real_pynvml_with_the_same_arity(name: str) -> None:
    real = getattr(pynvml, name)
    assert len(_positional(real)) == len(_positional(getattr(NVML, name)))


@pytest.mark.parametrize("name", METHODS)
def test_the_fake_offers_every_call_with_the_same_arity(name: str) -> None:
    fake = FakeNVML(load_inventory(T4))
    assert len(_positional(getattr(fake, name))) == len(_positional(getattr(NVML, name)))


def test_the_fake_satisfies_the_protocol_for_the_type_checker() -> None:
    nvml: NVML = FakeNVML(load_inventory(T4))  # mypy checks this assignment structurally
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 4


def test_cuda_versions_read_as_nvidia_smi_writes_them() -> None:
    assert cuda_version_text(12040) == "12.4"
    assert cuda_version_text(11080) == "11.8"


def test_error_text_names_the_class_even_for_codes_pynvml_cannot_describe() -> None:
    assert error_text(pynvml.NVMLError_GpuIsLost()) == "NVMLError_GpuIsLost: GPU is lost"
    assert error_text(pynvml.NVMLError(9999)).startswith("NVMLError: ")
