"""fgpu's record of the MIG instances it created, on the node's disk (`OwnedFile`).

Only ever trusted where NVML confirms it, MIG device UUID included (agent/mig_manager.py),
and only from a directory no one but the agent may write: whoever can write the record
decides which instances fgpu destroys. So it is written atomically as a fresh file in the
same directory (O_EXCL, fsync, rename: a link planted at the path is replaced, never
followed), read without following a link, and a state directory writable by group or
others is refused (`RecordError`, naming the directory, its mode and the fix) and read as
empty (fgpu then leaks rather than destroys).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.mig_manager import Intent, Owned
from agent.state_file import StateFileError, directory_problem, read_text, write_atomic

log = logging.getLogger(__name__)

WHAT = "fgpu's MIG record"


class RecordError(Exception):
    """fgpu's record cannot be written safely (a state directory others may write, a link)."""


@dataclass(frozen=True)
class Record:
    """What the record file holds: fgpu's instances, and the creates announced but not yet confirmed."""

    owned: frozenset[Owned] = frozenset()
    intents: frozenset[Intent] = field(default_factory=frozenset)


class OwnedFile:
    """fgpu's record of the instances it created, on the node's disk.

    A JSON list: `{"gpu_uuid", "gi_id", "profile", "placement_start", "uuid"}` per instance, and
    `{"intent": true, "gpu_uuid", "profile", "placement_start"}` per create under way. An
    older agent skips the intent rows (no `gi_id`), so a downgrade leaks rather than destroys.
    An entry without "uuid" (written by an agent before the UUID was recorded) is skipped: its
    instance cannot be told from an operator's made at the same place, so it is leaked.
    """

    def __init__(self, path: Path) -> None:
        self._path = path

    @property
    def path(self) -> Path:
        return self._path

    def problem(self) -> str:
        """Why the record's directory cannot be trusted (others may write it), or "" when it can."""
        return directory_problem(self._path.parent, what=WHAT)

    def read(self) -> frozenset[Owned]:
        return self.load().owned

    def load(self) -> Record:
        problem = self.problem()
        if problem:
            log.warning("%s; no MIG instance found is taken for fgpu's", problem)
            return Record()
        try:
            text = read_text(self._path)
            raw = json.loads(text) if text is not None else []
        except (StateFileError, ValueError) as err:
            # Unreadable, or a link planted at the path: fgpu then owns nothing it finds, and leaks.
            log.warning("MIG record %s unreadable (%s); no instance found is taken for fgpu's", self._path, err)
            return Record()
        owned, intents = set(), set()
        legacy = 0
        for item in raw if isinstance(raw, list) else []:
            try:
                if isinstance(item, dict) and item.get("intent") is True:
                    intents.add(Intent(str(item["gpu_uuid"]), str(item["profile"]), int(item["placement_start"])))
                elif isinstance(item, dict) and "uuid" not in item and "gi_id" in item:
                    legacy += 1
                else:
                    owned.add(Owned(
                        str(item["gpu_uuid"]), int(item["gi_id"]), str(item["profile"]), int(item["placement_start"]),
                        str(item["uuid"]),
                    ))
            except (KeyError, TypeError, ValueError):
                log.warning("MIG record %s: skipping entry %r", self._path, item)
        if legacy:
            log.warning(
                "MIG record %s: %d entr(ies) written by an older agent carry no MIG device UUID, so their instances "
                "cannot be told from an operator's made at the same place; they are treated as not fgpu's (kept "
                "until an operator removes them)", self._path, legacy,
            )
        return Record(frozenset(owned), frozenset(intents))

    def save(self, record: Record) -> None:
        """Writes the record atomically; RecordError when its directory is not the agent's alone."""
        rows: list[dict[str, Any]] = sorted((asdict(o) for o in record.owned), key=lambda r: (r["gpu_uuid"], r["gi_id"]))
        rows += sorted(
            ({"intent": True, **asdict(i)} for i in record.intents), key=lambda r: (r["gpu_uuid"], r["placement_start"])
        )
        # fsync before the rename: the intent must be on disk before NVML is asked to create.
        try:
            write_atomic(self._path, json.dumps(rows, sort_keys=True), what=WHAT)
        except StateFileError as err:
            raise RecordError(str(err)) from None
