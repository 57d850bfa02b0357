"""Quantities: the whole-number fast path gives what the exact parse gives, and only ASCII digits are numbers."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.quantity import QuantityError, parse_quantity

_FACTORS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
            "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


@given(st.text(alphabet="0123456789", min_size=1, max_size=25), st.sampled_from(sorted(_FACTORS)))
def test_whole_numbers_with_any_suffix(digits: str, suffix: str) -> None:
    assert parse_quantity(digits + suffix) == Fraction(int(digits)) * _FACTORS[suffix]
    # the same value written with a fraction part takes the exact path and agrees
    assert parse_quantity(f"{digits}.0{suffix}") == parse_quantity(digits + suffix)


@pytest.mark.parametrize("text, expected", [
    ("500m", Fraction(1, 2)), ("1.5", Fraction(3, 2)), ("1e3", 1000), ("+5", 5), (" 7 ", 7), ("05", 5),
    ("2.5Gi", Fraction(5, 2) * 2**30), ("100n", Fraction(1, 10**7)),
])
def test_other_forms_still_parse_exactly(text: str, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["k", "Gi", "5i", "5iK", "5KK", "5Gi5", "\u0661\u0662", "\uff15\uff10", "5\u0660Gi", "-"])
def test_not_quantities(text: str) -> None:
    with pytest.raises(QuantityError, match="is not a quantity"):
        parse_quantity(text, field="gpu-core")
