"""Structured logs: `msg key=value ...` (text) or one JSON object per line.

Call sites pass their fields as `extra={"fields": {...}}`; `event()` is the
short form. Every hooked call logs the pod (namespace/name, uid) and the
container it is about.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any


def event(logger: logging.Logger, level: int, msg: str, **fields: Any) -> None:
    if logger.isEnabledFor(level):
        logger.log(level, msg, extra={"fields": fields})


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "fields", None)
    return dict(fields) if isinstance(fields, dict) else {}


def _quote(value: Any) -> str:
    """`value` as one logfmt token: bare when plainly printable, else a JSON string.

    Values carry pod authors' text: a CR, ESC or NBSP left raw would rewrite or forge a line on a
    terminal, so anything not printable (Unicode's sense: controls, format and separator
    characters but the plain space) is quoted, and JSON escapes it.
    """
    text = str(value)
    if text == "" or not text.isprintable() or any(c in text for c in ' "='):
        return json.dumps(text)
    return text


def _printable(text: str) -> str:
    """`text` with each non-printable character escaped (the message is fgpu's, its arguments may not be)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else json.dumps(c)[1:-1] for c in text)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        head = f"{self.formatTime(record)} {record.levelname.lower()} {record.name}: {_printable(record.getMessage())}"
        parts = [head, *(f"{k}={_quote(v)}" for k, v in _fields(record).items())]
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": self.formatTime(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(_fields(record))
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def configure(*, level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
