"""File paths named in a daemon's config file: absolute, or the file means something else under systemd.

A relative path in a config file is resolved against the daemon's working directory, which is
`/` under systemd and the image's WORKDIR in a pod, not the config file's directory: the same file
would name different files on different nodes. Command-line flags are not checked here: a path
typed in a shell is relative to that shell, which is what its author meant.
"""

from __future__ import annotations

import os


class PathError(ValueError):
    """A path the config names is relative; the message names the field, the value and the fix."""


def absolute(value: str, *, field: str, example: str) -> str:
    """`value` when it is empty or absolute; PathError naming `field`, the value and `example` otherwise."""
    if value and not os.path.isabs(value):
        raise PathError(
            f"{field}={value!r} must be an absolute path: a relative one is read from the daemon's working "
            f"directory (/ under systemd), not the config file's; write e.g. {example}"
        )
    return value
