"""PCI bus ids as NVML and sysfs spell them. Pure; the hook orders a container's GPUs by them."""

from __future__ import annotations


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:1B:00.0" in the form sysfs names devices: "0000:1b:00.0".

    Linux prints the domain with "%04x", so a domain above 0xffff (Intel VMD numbers its
    domains from 0x10000) keeps all its digits: NVML's "00010000:01:00.0" is "10000:01:00.0".
    Cutting it to four digits would name another device (0000:01:00.0).
    """
    domain, _, rest = nvml_bus_id.partition(":")
    try:
        number = int(domain, 16)
    except ValueError:
        return nvml_bus_id.lower()  # not a bus id NVML writes; left as it is, found nowhere in sysfs
    return f"{number:04x}:{rest}".lower()


def bus_order_key(nvml_bus_id: str) -> str:
    """A key that sorts bus ids as CUDA's PCI_BUS_ID order does: by domain, bus, device, function.

    sysfs names do not sort so ("10000:01:00.0" comes before "2000:01:00.0" as text), so
    the domain is written in NVML's fixed eight digits, where text order is number order.
    """
    domain, _, rest = nvml_bus_id.partition(":")
    try:
        number = int(domain, 16)
    except ValueError:
        return nvml_bus_id.lower()
    return f"{number:08x}:{rest}".lower()
