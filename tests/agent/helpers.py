"""Shared builders for the agent tests: example inventories, a started fake NVML, signed pods."""

from __future__ import annotations

import os

from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import Inventory, load_inventory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INVENTORIES = os.path.join(ROOT, "examples", "inventories")
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")

H100 = os.path.join(INVENTORIES, "h100-8x-nvlink.yaml")
T4 = os.path.join(INVENTORIES, "t4-4x-pcie.yaml")
A100_MIG = os.path.join(INVENTORIES, "a100-4x-mig.yaml")
MIXED = os.path.join(INVENTORIES, "mixed-mig.yaml")
ALL_INVENTORIES = (H100, T4, A100_MIG, MIXED)


def started_fake(path: str) -> tuple[FakeNVML, Inventory]:
    inventory = load_inventory(path)
    nvml = FakeNVML(inventory)
    nvml.nvmlInit()
    return nvml, inventory


def data_file(*parts: str) -> str:
    return os.path.join(DATA, *parts)


def read_data(*parts: str) -> str:
    with open(data_file(*parts), encoding="utf-8") as f:
        return f.read()
