"""Pod authors' text as fgpu's messages repeat it: quoted, escaped and cut short.

Annotations, label values and names are chosen by pod authors (an annotation may hold 256 KiB
of any text) and reach Events, the scheduler's reasons, logs, terminals and the web page. A
message repeats at most SHOWN_MAX characters of such a value, in Python's repr(): control
characters, bidi overrides and other non-printable characters come out as escapes.
"""

from __future__ import annotations

#: The most of a value a message repeats.
SHOWN_MAX = 64


def quoted(value: str, *, limit: int = SHOWN_MAX) -> str:
    """`value` for a message: quoted and escaped (non-printable characters as escapes), cut to `limit` characters."""
    return repr(value[:limit]) + ("..." if len(value) > limit else "")
