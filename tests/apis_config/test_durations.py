"""apis.durations: the one parser of every config's intervals, timeouts and graces."""

from __future__ import annotations

import math

import pytest

from apis import durations
from apis.durations import Bounds, DurationError

DAY = Bounds(maximum=durations.DAY)


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        (30, 30.0),
        (0.25, 0.25),
        ("30", 30.0),
        (" 2.5 ", 2.5),
        ("500ms", 0.5),
        ("1.5s", 1.5),
        (".5s", 0.5),
        ("1.s", 1.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1h30m1.5s", 5401.5),
        ("1h 30m", 5400.0),
        ("2 s", 2.0),
        ("+2s", 2.0),
        ("1500000us", 1.5),
        ("1500000µs", 1.5),  # U+00B5, as Go writes it
        ("1500000μs", 1.5),  # U+03BC, which Go accepts too
        ("1000000000ns", 1.0),
        ("24h", 86400.0),
    ],
)
def test_numbers_and_go_durations_are_read_as_seconds(raw: object, seconds: float) -> None:
    assert durations.parse(raw, field="f", bounds=DAY) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (True, "f=True: not a duration; write a number of seconds or a Go duration"),
        (None, "f=None: not a duration"),
        ([1], "f=[1]: not a duration"),
        ("", "f='': not a duration"),
        ("  ", "f='  ': not a duration"),
        ("2x", "f='2x': not a duration"),
        ("1d", "f='1d': not a duration"),
        ("5m3", "f='5m3': not a duration"),
        ("1 30m", "f='1 30m': not a duration"),
        ("1e3s", "f='1e3s': not a duration"),
        ("1_000s", "f='1_000s': not a duration"),
        ("٣s", "not a duration"),  # an Arabic-Indic digit: \d would have read it
        ("s", "f='s': not a duration"),
        (math.nan, "f=nan: not a finite number of seconds"),
        (math.inf, "f=inf: not a finite number of seconds"),
        (-math.inf, "f=-inf: not a finite number of seconds"),
        (-1, "f=-1: must not be negative"),
        ("-5s", "f='-5s': must not be negative"),
        (0, "f=0: must be more than zero"),
        ("0s", "f='0s': must be more than zero"),
        (86401, "f=86401: at most 86400s (1 day)"),
        ("25h", "f='25h': at most 86400s (1 day)"),
        (10**400, "at most 86400s"),
        ("9" * 65, "too long for a duration"),
    ],
)
def test_what_is_not_a_duration_in_bounds_is_refused_naming_field_value_and_example(raw: object, says: str) -> None:
    with pytest.raises(DurationError) as caught:
        durations.parse(raw, field="f", bounds=DAY, example="2s")
    message = str(caught.value)
    assert says in message and message.endswith("e.g. 2s")
    assert len(message) < 300


@pytest.mark.parametrize(
    ("bounds", "raw", "outcome"),
    [
        (Bounds(maximum=60, zero=True), "0s", 0.0),
        (Bounds(maximum=60, zero=True), 0, 0.0),
        (Bounds(maximum=60, minimum=1, zero=True), 0, 0.0),
        (Bounds(maximum=60, minimum=1, zero=True), "0.5s", "must be at least 1s"),
        (Bounds(maximum=60, minimum=1), "0s", "must be at least 1s"),
        (Bounds(maximum=60, minimum=1, why_minimum="0 would force-delete"), 0, "at least 1s (0 would force-delete)"),
        (Bounds(maximum=3600, why_maximum="too long to wait"), "2h", "at most 3600s (too long to wait)"),
        (Bounds(maximum=3600), "1h", 3600.0),
        (Bounds(maximum=durations.YEAR), "8784h", durations.YEAR),
        (Bounds(maximum=durations.YEAR), "8785h", "at most 31622400s (366 days)"),
    ],
)
def test_each_field_brings_its_bounds(bounds: Bounds, raw: object, outcome: float | str) -> None:
    if isinstance(outcome, float):
        assert durations.parse(raw, field="f", bounds=bounds) == outcome
    else:
        with pytest.raises(DurationError, match=outcome.replace("(", r"\(").replace(")", r"\)")):
            durations.parse(raw, field="f", bounds=bounds)


@pytest.mark.parametrize(("seconds", "text"), [(1, "1s"), (0.5, "0.5s"), (3600, "3600s"), (172800, "172800s (2 days)")])
def test_bounds_are_shown_in_seconds(seconds: float, text: str) -> None:
    assert durations.show(seconds) == text

