"""Which pod and container a process belongs to, from /proc/<pid>/cgroup.

kubelet names pod cgroups after the pod UID and runtimes name container
cgroups after the container ID, in one of four layouts:

    cgroup v1, cgroupfs:  4:memory:/kubepods/burstable/pod0c2f.../8d5a...64hex
    cgroup v1, systemd:   4:memory:/kubepods.slice/kubepods-burstable.slice/
                            kubepods-burstable-pod0c2f..._....slice/cri-containerd-8d5a....scope
    cgroup v2, cgroupfs:  0::/kubepods/besteffort/pod0c2f.../8d5a...
    cgroup v2, systemd:   0::/kubepods.slice/kubepods-pod0c2f....slice/cri-containerd-8d5a....scope

(the systemd driver writes the UID with underscores for dashes). Guaranteed
pods have no QoS level in the path. Parsing is pure; `PidResolver` adds the
per-pid cache that keeps a usage cycle cheap: a process's cgroup does not
change while it lives, so its file is read once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

_POD_SEGMENT = re.compile(
    r"(?:^|[-/])pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})(?:\.slice)?$"
)
_CONTAINER_SEGMENT = re.compile(r"^(?:(?:cri-containerd|containerd|docker|crio|cri-o|libpod)-)?([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True)
class CgroupOwner:
    pod_uid: str
    container_id: str = ""


#: What a process outside any pod maps to.
NO_OWNER = CgroupOwner(pod_uid="")


def parse_cgroup_file(content: str) -> CgroupOwner:
    """The pod and container of a /proc/<pid>/cgroup content; NO_OWNER outside pods.

    The unified (v2) line wins when the pod shows there; on v1 every controller
    line names the same pod, so the first that does is used.
    """
    best: CgroupOwner | None = None
    for line in content.splitlines():
        hierarchy, _, rest = line.partition(":")
        _controllers, _, path = rest.partition(":")
        owner = parse_cgroup_path(path)
        if owner is NO_OWNER:
            continue
        if hierarchy == "0" or best is None:
            best = owner
        if hierarchy == "0":
            break
    return best or NO_OWNER


def parse_cgroup_path(path: str) -> CgroupOwner:
    """The pod and container of one cgroup path."""
    segments = [s for s in path.strip().split("/") if s]
    for i, segment in enumerate(segments):
        match = _POD_SEGMENT.search(segment)
        if match is None:
            continue
        uid = match.group(1).replace("_", "-").lower()
        container = ""
        for later in segments[i + 1 :]:
            c = _CONTAINER_SEGMENT.match(later)
            if c is not None:
                container = c.group(1)
                break
        return CgroupOwner(pod_uid=uid, container_id=container)
    return NO_OWNER


class PidResolver:
    """pid -> CgroupOwner, reading /proc/<pid>/cgroup once per process."""

    def __init__(self, *, proc_root: str = "/proc", cached: bool = True) -> None:
        self._proc_root = proc_root
        #: False reads the file on every call: the unoptimised baseline bench/agent.py compares against.
        self._cached = cached
        self._cache: dict[int, CgroupOwner] = {}
        self.reads = 0

    def resolve(self, pid: int) -> CgroupOwner:
        owner = self._cache.get(pid)
        if owner is None:
            owner = self._read(pid)
            if self._cached:
                self._cache[pid] = owner
        return owner

    def retain(self, live_pids: Iterable[int]) -> None:
        """Forgets pids not seen this cycle, so a reused pid is read afresh."""
        live = set(live_pids)
        for pid in [p for p in self._cache if p not in live]:
            del self._cache[pid]

    def _read(self, pid: int) -> CgroupOwner:
        self.reads += 1
        try:
            with open(os.path.join(self._proc_root, str(pid), "cgroup"), encoding="utf-8", errors="replace") as f:
                return parse_cgroup_file(f.read())
        except OSError:
            # Gone already, or another pid namespace: report it as outside pods.
            return NO_OWNER
