"""PCI bus ids as NVML and sysfs spell them. Pure; the hook orders a container's GPUs by them."""

from __future__ import annotations


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:1B:00.0" in the form sysfs names devices: "0000:1b:00.0"."""
    domain, _, rest = nvml_bus_id.partition(":")
    return f"{domain[-4:]}:{rest}".lower()
