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

import contextlib
import errno
import json
import logging
import os
import stat
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.mig_manager import Intent, Owned

log = logging.getLogger(__name__)


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
        try:
            st = os.lstat(self._path.parent)
        except FileNotFoundError:
            return ""
        except OSError as err:
            return f"fgpu's MIG record directory {self._path.parent} cannot be read: {err.strerror}"
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            return f"fgpu's MIG record directory {self._path.parent} is not a directory (a symlink?); make it one"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return (
                f"fgpu's MIG record directory {self._path.parent} is writable by group or others "
                f"(mode {stat.S_IMODE(st.st_mode):o}), so anyone could forge which MIG instances fgpu destroys; "
                "chmod go-w it, or set stateDir to a directory only the agent writes"
            )
        return ""

    def read(self) -> frozenset[Owned]:
        return self.load().owned

    def load(self) -> Record:
        problem = self.problem()
        if problem:
            log.warning("%s; no MIG instance found is taken for fgpu's", problem)
            return Record()
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return Record()
        except OSError as err:
            # Unreadable, or a link planted at the path: fgpu then owns nothing it finds, and leaks.
            why = "is a symlink" if err.errno == errno.ELOOP else err.strerror
            log.warning("MIG record %s unreadable (%s); no instance found is taken for fgpu's", self._path, why)
            return Record()
        try:
            with os.fdopen(fd, encoding="utf-8") as f:
                raw = json.loads(f.read())
        except (OSError, ValueError) as err:
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
        directory = self._path.parent
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        problem = self.problem()
        if problem:
            raise RecordError(problem)
        rows: list[dict[str, Any]] = sorted((asdict(o) for o in record.owned), key=lambda r: (r["gpu_uuid"], r["gi_id"]))
        rows += sorted(
            ({"intent": True, **asdict(i)} for i in record.intents), key=lambda r: (r["gpu_uuid"], r["placement_start"])
        )
        # A fresh file (O_EXCL, mode 0600) in the same directory, renamed over the record: a link
        # planted at either name is never followed, and readers see the old or the new record whole.
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{self._path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(json.dumps(rows, sort_keys=True))
                out.flush()
                # fsync before the rename: the intent must be on disk before NVML is asked to create.
                os.fsync(out.fileno())
            os.replace(tmp, self._path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
