"""Text logs stay one printable line per record, whatever a pod author put in a field."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from runtimeproxy.logs import JSONFormatter, TextFormatter


def _line(fields: dict[str, Any], msg: str = "CreateContainer refused", args: tuple[object, ...] = ()) -> str:
    record = logging.LogRecord("fgpu.runtimeproxy", logging.INFO, __file__, 1, msg, args, None)
    record.fields = fields
    return TextFormatter().format(record)


@pytest.mark.parametrize(
    ("value", "token"),
    [
        ("team/p", "team/p"),
        ("\u754c", "\u754c"),  # printable non-ASCII stays bare
        ("", '""'),
        ("a b", '"a b"'),
        ('a"b', '"a\\"b"'),
        ("a=b", '"a=b"'),
        ("a\nb", '"a\\nb"'),
        ("a\rb", '"a\\rb"'),
        ("\x1b[2K", '"\\u001b[2K"'),
        ("a\xa0b", '"a\\u00a0b"'),  # NBSP looks like a space
        ("\x9b31m", '"\\u009b31m"'),  # the 8-bit CSI
        ("\u202eevil", '"\\u202eevil"'),  # a right-to-left override
    ],
)
def test_a_field_is_bare_only_when_plainly_printable(value: str, token: str) -> None:
    line = _line({"reason": value})
    assert line.endswith(f" reason={token}")
    assert line.isprintable()
    if token.startswith('"'):
        assert json.loads(token) == value


def test_message_arguments_are_escaped_too() -> None:
    line = _line({}, "refused %s", ("team/p\r\x1b[2Kforged",))
    assert line.isprintable() and line.endswith("refused team/p\\r\\u001b[2Kforged")


def test_json_lines_keep_the_value_as_written() -> None:
    record = logging.LogRecord("fgpu.runtimeproxy", logging.INFO, __file__, 1, "m", None, None)
    record.fields = {"reason": "x\r\x1b\xa0y"}
    line = JSONFormatter().format(record)
    assert line.isprintable() and json.loads(line)["reason"] == "x\r\x1b\xa0y"
