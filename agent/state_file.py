"""Files in the agent's node-local state directory, read and written so no one else can steer them.

Whoever can write a state file decides what the agent does with the node's GPUs (which MIG
instances it destroys, which GPUs it calls unhealthy), so: a directory writable by group or
others is not trusted (`directory_problem`); a file is read without following a link
(`read_text`); and it is written as a fresh file in the same directory, renamed over the old
one (`write_atomic`): a link planted at either name is never followed, and readers see the
old or the new content whole.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path


class StateFileError(Exception):
    """A state file that cannot be read or written safely; the message names the path and the fix."""


def directory_problem(directory: Path, *, what: str) -> str:
    """Why `directory` cannot be trusted for `what` (others may write it), or "" when it can (or is absent)."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return ""
    except OSError as err:
        return f"{what} directory {directory} cannot be read: {err.strerror}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{what} directory {directory} is not a directory (a symlink?); make it one"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"{what} directory {directory} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}), "
            "so anyone could forge the agent's state; chmod go-w it, or set stateDir to a directory only the agent writes"
        )
    return ""


def read_text(path: Path) -> str | None:
    """The file's text, or None when it does not exist; StateFileError when it is a link or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as err:
        why = "is a symlink" if err.errno == errno.ELOOP else err.strerror
        raise StateFileError(f"{path} unreadable ({why})") from None
    try:
        with os.fdopen(fd, encoding="utf-8") as f:
            return f.read()
    except (OSError, ValueError) as err:
        raise StateFileError(f"{path} unreadable ({err})") from None


def write_atomic(path: Path, text: str, *, what: str) -> None:
    """Writes `text` to `path` whole (fsync, then rename); StateFileError when its directory is not the agent's alone."""
    directory = path.parent
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    problem = directory_problem(directory, what=what)
    if problem:
        raise StateFileError(problem)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            # Before the rename: what the file says must be on disk before the agent acts on it.
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
