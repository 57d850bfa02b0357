"""A usage file the fake NVML follows while it runs, so a script outside the agent process can change
what NVML reports (hack/localup's overcommit demo grows a pod's GPU memory with it).

Read by `agent.fakenvml.FakeNVML` whenever the file changes; a file that does not read is logged
there and changes nothing (the fake must not take the agent down).
"""

from __future__ import annotations

import logging
import os

import yaml

from agent.fakenvml_inventory import InventoryError, ProcessSpec, _bytes, _int, _mapping, _process
from apis import names

_log = logging.getLogger(__name__)

UsageEntry = tuple[int, int | None, tuple[ProcessSpec, ...] | None]

#: Names a YAML file of GPU usage the fake follows while it runs (read again whenever it changes), so a
#: script outside the agent process can grow a pod's GPU memory (hack/localup's overcommit demo). A list;
#: each entry sets what it names on its GPU (index), as `FakeNVML.set_usage` does:
#:
#:     - {gpu: 0, memoryUsed: 77Gi, processes: [{pid: 4242, usedMemory: 27Gi}]}
#:
#: A file that does not read is logged and changes nothing (the fake must not take the agent down).
USAGE_FILE_ENV = names.FAKE_NVML_USAGE_ENV


def load_usage(path: str, *, gpus: int) -> list[UsageEntry]:
    """The entries of a usage file (`USAGE_FILE_ENV`): (GPU index, memory used or None, processes or None)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as err:
        raise InventoryError(f"usage file {path}: cannot read it ({err})") from err
    if not isinstance(data, list):
        raise InventoryError(f"usage file {path}: {data!r} is not a list; write [{{gpu: 0, memoryUsed: 10Gi}}]")
    entries = []
    for i, raw in enumerate(data):
        where = f"{path}[{i}]"
        m = _mapping(raw, where, {"gpu", "memoryUsed", "processes"})
        index = _int(m.get("gpu"), f"{where}.gpu")
        if not 0 <= index < gpus:
            raise InventoryError(f"{where}.gpu: {index} is not a GPU index here; write 0 to {gpus - 1}")
        used = _bytes(m["memoryUsed"], f"{where}.memoryUsed") if "memoryUsed" in m else None
        procs = m.get("processes")
        if procs is not None and not isinstance(procs, list):
            raise InventoryError(f"{where}.processes: {procs!r} is not a list of {{pid, usedMemory}}")
        processes = None if procs is None else tuple(_process(p, f"{where}.processes[{j}]") for j, p in enumerate(procs))
        entries.append((index, used, processes))
    return entries


class UsageFile:
    """The usage file at `path` ("" = none), read again only when it changed (inode, mtime, size)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None

    def changes(self, *, gpus: int) -> list[UsageEntry]:
        """The file's entries when it changed since the last look, else []; a bad file is logged."""
        if not self.path:
            return []
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return []  # none yet: the inventory's usage stands
        except OSError as err:
            _log.error("usage file %s: %s", self.path, err)
            return []
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return []
        self._stamp = stamp
        try:
            return load_usage(self.path, gpus=gpus)
        except InventoryError as err:
            _log.error("%s; the fake NVML keeps the usage it had", err)
            return []
