"""PCI bus ids: NVML's spelling to sysfs's, and the order CUDA's PCI_BUS_ID numbering uses."""

from __future__ import annotations

import pytest

from agent.pci_address import bus_order_key, sysfs_bus_id


@pytest.mark.parametrize(("nvml", "sysfs"), [
    ("00000000:1B:00.0", "0000:1b:00.0"),
    ("0000:1b:00.0", "0000:1b:00.0"),  # already in sysfs form
    ("00010000:01:00.0", "10000:01:00.0"),  # Intel VMD: Linux prints the domain %04x, all its digits
    ("0001ABCD:3F:00.1", "1abcd:3f:00.1"),
    ("0000A000:01:00.0", "a000:01:00.0"),
    ("", ""),
])
def test_nvml_bus_ids_are_named_as_sysfs_names_the_device(nvml: str, sysfs: str) -> None:
    assert sysfs_bus_id(nvml) == sysfs


def test_a_vmd_domain_does_not_collapse_onto_domain_zero() -> None:
    assert sysfs_bus_id("00010000:01:00.0") != sysfs_bus_id("00000000:01:00.0")


def test_bus_ids_order_by_domain_as_a_number_then_bus_device_function() -> None:
    ids = ["00010000:01:00.0", "0000A000:01:00.0", "00002000:01:00.0", "00000000:86:00.0", "00000000:3B:00.0"]
    assert sorted(ids, key=bus_order_key) == [
        "00000000:3B:00.0", "00000000:86:00.0", "00002000:01:00.0", "0000A000:01:00.0", "00010000:01:00.0",
    ]
    # The same ids in sysfs's spelling (as the kernel names them) and NVML's give one order.
    assert sorted(ids, key=lambda i: bus_order_key(sysfs_bus_id(i))) == sorted(ids, key=bus_order_key)
