"""The agent's record of its unhealthy GPUs, so a restarted agent does not call them healthy.

Health is learnt from events (an Xid is delivered once, to whoever listens then), so a new
agent process would otherwise start with every GPU healthy: a DaemonSet rollout or a crash
right after an Xid 48 would hand the failed GPU to the next pod. The record lists each
unhealthy GPU with its reason and is written at every health transition. A restarted agent
takes every GPU in it as failed at its own start (`HealthTracker.restore`), so the quiet
period starts again: recovery is never sooner than before the restart.

The record holds the boot it was written in: GPUs are reset by a reboot, and a record
from an earlier boot (a state directory on persistent disk) is ignored. It lives in the
state directory beside the MIG record, read and written as `agent.state_file` says.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

from agent.state_file import StateFileError, directory_problem, read_text, write_atomic

log = logging.getLogger(__name__)

WHAT = "fgpu's GPU health record"


def read_boot_id(proc_root: str = "/proc") -> str:
    """This boot's ID from the kernel; "" when unreadable (then any record is taken as this boot's)."""
    try:
        with open(Path(proc_root) / "sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except (OSError, ValueError):
        return ""


class HealthRecord:
    """`{"boot_id": str, "unhealthy": {uuid: reason}}` in one JSON file."""

    def __init__(self, path: Path, *, boot_id: str) -> None:
        self._path = path
        self._boot_id = boot_id

    @property
    def path(self) -> Path:
        return self._path

    def load(self) -> dict[str, str]:
        """The unhealthy GPUs recorded in this boot; {} (with a warning) when the record cannot be trusted."""
        problem = directory_problem(self._path.parent, what=WHAT)
        if problem:
            log.warning("%s; GPU health starts from scratch", problem)
            return {}
        try:
            text = read_text(self._path)
            raw = json.loads(text) if text is not None else {}
        except (StateFileError, ValueError) as err:
            log.warning("GPU health record %s unreadable (%s); GPU health starts from scratch", self._path, err)
            return {}
        if not isinstance(raw, dict) or not isinstance(raw.get("unhealthy"), dict):
            log.warning("GPU health record %s is not {\"boot_id\", \"unhealthy\"}; GPU health starts from scratch", self._path)
            return {}
        recorded = str(raw.get("boot_id", ""))
        if self._boot_id and recorded and recorded != self._boot_id:
            log.info("GPU health record %s is from an earlier boot; the reboot reset the GPUs", self._path)
            return {}
        return {str(uuid): str(reason) for uuid, reason in raw["unhealthy"].items()}

    def save(self, unhealthy: Mapping[str, str]) -> None:
        """Writes the record; a failure is logged, never raised (health itself goes on in memory)."""
        text = json.dumps({"boot_id": self._boot_id, "unhealthy": dict(sorted(unhealthy.items()))})
        try:
            write_atomic(self._path, text, what=WHAT)
        except (OSError, StateFileError) as err:
            log.warning(
                "GPU health record %s not written (%s); a restarted agent would not know these GPUs failed: %s",
                self._path, err, ", ".join(sorted(unhealthy)) or "none",
            )
