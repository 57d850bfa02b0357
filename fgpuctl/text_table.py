"""Plain-text tables for the terminal (`fgpuctl top`, `fgpuctl inspect`), safe for any cell text.

Cells can carry text a pod author chose (an allocation annotation re-written with `kubectl
annotate`, an agent's labels): an ESC, BEL, CR or 8-bit CSI printed raw would drive the
reader's terminal, and a 4000-character cell would push every column off the screen. So every
cell is escaped (each non-printable character as its Python escape, e.g. \\x1b) and cut to
CELL_MAX characters, the cut marked with an ellipsis.
"""

from __future__ import annotations

from collections.abc import Sequence

#: The most characters one cell shows.
CELL_MAX = 64
_CUT = "\u2026"


def printable(text: str) -> str:
    """`text` with each non-printable character (controls, bidi overrides, odd spaces) as its escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def cell(text: str, limit: int = CELL_MAX) -> str:
    """`text` escaped and cut to `limit` characters (the last one an ellipsis when cut)."""
    shown = printable(text)
    return shown if len(shown) <= limit else shown[: limit - 1] + _CUT


def render(rows: Sequence[Sequence[str]], *, gap: str = "  ", free_last: bool = False) -> list[str]:
    """Rows (the first the header) as aligned lines, each cell escaped and cut.

    `free_last`: the last column is not padded and only escaped, not cut (a list, such as a GPU's
    pods, that is the line's tail).
    """
    shown = [
        [cell(c) if not (free_last and i == len(row) - 1) else printable(c) for i, c in enumerate(row)]
        for row in rows
    ]
    if not shown:
        return []
    columns = len(shown[0]) - (1 if free_last else 0)
    widths = [max(len(row[i]) for row in shown) for i in range(columns)]
    lines = []
    for row in shown:
        padded = [c.ljust(w) for c, w in zip(row[:columns], widths, strict=True)]
        lines.append(gap.join([*padded, *row[columns:]]).rstrip())
    return lines
