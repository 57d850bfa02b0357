"""Durations in config files: one parser for every component's intervals, timeouts and graces.

A duration is a number of seconds (YAML `30`, `0.5`, or the text "30") or Go's duration form, which
Kubernetes objects use too: a sequence of numbers with units `ns`, `us` (`µs`, `μs`), `ms`, `s`, `m`,
`h`, such as `500ms`, `1.5s`, `5m`, `1h30m`. Each field passes its own `Bounds`:

    POLL = durations.Bounds(maximum=durations.DAY)
    seconds = durations.parse(raw, field="pollInterval", bounds=POLL, example="1s")

NaN, infinities, negative values, booleans and empty text are refused with a `DurationError` that
names the field, the value and what to write instead; the caller wraps it in its own ConfigError.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

DAY = 86400.0
#: Longer than any sensible interval or grace, and far below what a timer accepts (threading.TIMEOUT_MAX).
YEAR = 366 * DAY

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)"
#: Units longest first, so that "ms" is not read as "m" followed by a stray "s".
_UNIT = "|".join(sorted((re.escape(u) for u in _UNITS), key=len, reverse=True))
_PART = re.compile(rf"\s*({_NUMBER})\s*({_UNIT})", re.ASCII)
_BARE = re.compile(rf"\s*([+-]?)\s*({_NUMBER})\s*", re.ASCII)
_COMPOUND = re.compile(rf"\s*([+-]?)((?:\s*{_NUMBER}\s*(?:{_UNIT}))+)\s*", re.ASCII)
#: Past this the text is a typo or an attack, not a duration (the longest sane one is "8784h0m0.000000001s").
_MAX_TEXT = 64


class DurationError(ValueError):
    """The value is not a duration the field accepts; the message names the field, the value and the fix."""


@dataclass(frozen=True)
class Bounds:
    """What a field accepts, in seconds. `zero` lets 0 through even below `minimum` (e.g. "0: off")."""

    maximum: float
    minimum: float = 0.0
    zero: bool = False
    #: Said after a value below `minimum` (or 0 when refused): why the floor is there.
    why_minimum: str = ""
    #: Said after a value above `maximum`.
    why_maximum: str = ""


def parse(raw: object, *, field: str, bounds: Bounds, example: str = "30s") -> float:
    """Seconds from a number or a Go duration, within `bounds`; DurationError otherwise."""
    seconds = _seconds(raw, field=field, example=example)
    fix = f"write e.g. {example}"
    # YAML's .nan and .inf; an integer too long for a float is merely too long, below.
    if isinstance(raw, float) and not math.isfinite(raw):
        raise DurationError(f"{field}={_shown(raw)}: not a finite number of seconds; {fix}")
    if seconds < 0:
        raise DurationError(f"{field}={_shown(raw)}: must not be negative; {fix}")
    if seconds == 0 and bounds.zero:
        return 0.0
    if seconds == 0 and bounds.minimum <= 0:
        raise DurationError(f"{field}={_shown(raw)}: must be more than zero; {fix}")
    if seconds < bounds.minimum or seconds == 0:
        why = f" ({bounds.why_minimum})" if bounds.why_minimum else ""
        raise DurationError(f"{field}={_shown(raw)}: must be at least {show(bounds.minimum)}{why}; {fix}")
    if seconds > bounds.maximum:
        why = f" ({bounds.why_maximum})" if bounds.why_maximum else ""
        raise DurationError(f"{field}={_shown(raw)}: at most {show(bounds.maximum)}{why}; {fix}")
    return seconds


def show(seconds: float) -> str:
    """A bound as a reader writes it: 1s, 3600s, 86400s (1 day), 0.5s."""
    text = f"{int(seconds)}s" if seconds == int(seconds) else f"{seconds:g}s"
    if seconds >= DAY and seconds % DAY == 0:
        days = int(seconds // DAY)
        text += f" ({days} day{'s' if days != 1 else ''})"
    return text


def _seconds(raw: object, *, field: str, example: str) -> float:
    """The value in seconds, unbounded: may be negative, infinite or NaN for the caller to judge."""
    wrong = (
        f"{field}={_shown(raw)}: not a duration; write a number of seconds or a Go duration "
        f"(units ns, us, ms, s, m, h), e.g. {example}"
    )
    # A bool is an int to Python, and `true` in YAML is no one's idea of a timeout.
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise DurationError(wrong)
    if isinstance(raw, int):
        try:
            return float(raw)
        except OverflowError:  # an integer literal with hundreds of digits
            return math.inf if raw > 0 else -math.inf
    if isinstance(raw, float):
        return raw
    if len(raw) > _MAX_TEXT:
        raise DurationError(f"{field}={_shown(raw)}: too long for a duration; write e.g. {example}")
    bare = _BARE.fullmatch(raw)
    if bare is not None:
        return _signed(bare.group(1), float(bare.group(2)))
    compound = _COMPOUND.fullmatch(raw)
    if compound is None:
        raise DurationError(wrong)
    total = sum(float(number) * _UNITS[unit] for number, unit in _PART.findall(compound.group(2)))
    return _signed(compound.group(1), total)


def _shown(raw: object) -> str:
    """The value as the reader wrote it, cut short: a 400-digit number makes no better message."""
    try:
        text = repr(raw)
    except ValueError:  # an integer past Python's digit limit for str()
        return "<a number thousands of digits long>"
    return text if len(text) <= _MAX_TEXT else text[:_MAX_TEXT] + "..."


def _signed(sign: str, seconds: float) -> float:
    return -seconds if sign == "-" else seconds
