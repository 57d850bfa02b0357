"""Kubernetes resource quantities ("50", "20Gi", "1.5", "500m", "1e3").

Parsing is exact (fractions, never floats) so that a request of "20Gi" is
20 * 2**30 bytes to the byte, and "0.5" for a count is caught as fractional
rather than rounded.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
#: Kubernetes itself caps quantities far below 10**30; a huge exponent would hang Fraction arithmetic.
_MAX_EXPONENT = 30
#: suffixes that scale a whole number to a whole number
_WHOLE_FACTORS = {**_BINARY, **{k: int(v) for k, v in _DECIMAL.items() if v.denominator == 1}}
#: ASCII digits only, as Kubernetes parses them (`\d` alone would take any script's digits)
_PATTERN = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$", re.ASCII)


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity."""


def parse_quantity(value: object, *, field: str = "quantity") -> Fraction:
    """Parses a quantity as Kubernetes does; `field` names it in the error."""
    if isinstance(value, bool):
        raise QuantityError(f"{field}: {value!r} is not a quantity; write a number such as 50 or 20Gi")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    if not isinstance(value, str):
        raise QuantityError(f"{field}: {value!r} is not a quantity; write a number such as 50 or 20Gi")
    text = value.strip()
    # The usual form, ASCII digits and a whole suffix ("50", "20Gi", "41758208Ki"), costs an int() instead of
    # the pattern and a Fraction parse: the agent's hook and the proxy read several per container created.
    digits = text.rstrip("KMGTPEik")
    if digits and digits.isascii() and digits.isdigit():
        factor = _WHOLE_FACTORS.get(text[len(digits):])
        if factor is not None:
            return Fraction(int(digits) * factor)
    match = _PATTERN.match(text)
    if match is None:
        raise QuantityError(f"{field}: {value!r} is not a quantity; write a number such as 50 or 20Gi")
    number, exponent, suffix = match.groups()
    result = Fraction(number)
    if exponent:
        power = int(exponent[1:])
        if abs(power) > _MAX_EXPONENT:
            raise QuantityError(f"{field}: {value!r} is out of range; write a number such as 50 or 20Gi")
        result *= Fraction(10) ** power
    elif suffix in _BINARY:
        result *= _BINARY[suffix]
    else:
        result *= _DECIMAL[suffix or ""]
    return result


def format_bytes(n: int) -> str:
    """Canonical Kubernetes form of a byte count: the largest binary suffix that divides it exactly."""
    if n < 0:
        raise QuantityError(f"byte count {n} is negative")
    if n == 0:
        return "0"
    for suffix, factor in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
        if n % factor == 0:
            return f"{n // factor}{suffix}"
    return str(n)
