"""Kubernetes resource quantities ("500m", "2", "16Gi", "1e9") to CPU milli and memory MiB."""

from __future__ import annotations

import math
from decimal import Decimal

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal(10**3),
            "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18)}  # fmt: skip

_LIMIT = Decimal(2**63)


def parse_quantity(value: str | int | float, field: str = "quantity") -> Decimal:
    """The numeric value of a quantity; raises ValueError naming ``field`` when it is malformed."""
    if isinstance(value, bool):
        raise ValueError(f"{field}: expected a quantity, got {value!r}")
    text = str(value).strip()
    if not text:
        raise ValueError(f"{field}: empty quantity")
    try:
        if isinstance(value, int | float):
            number = Decimal(text)
        elif text[-2:] in _BINARY:
            number = Decimal(text[:-2]) * _BINARY[text[-2:]]
        elif text[-1].isalpha() and text[-1] in _DECIMAL:
            number = Decimal(text[:-1]) * _DECIMAL[text[-1]]
        else:
            number = Decimal(text)
    except ArithmeticError:  # InvalidOperation, or Overflow from an exponent past the context's
        raise ValueError(f"{field}: {text!r} is not a Kubernetes quantity") from None
    if not number.is_finite():  # "Infinity", "NaN", "sNaN" parse as Decimals, and no quantity is one
        raise ValueError(f"{field}: {text!r} is not a finite Kubernetes quantity")
    if number.copy_abs() >= _LIMIT:  # Kubernetes itself holds quantities in 64 bits
        raise ValueError(f"{field}: {text!r} is out of range for a Kubernetes quantity")
    return number


def cpu_milli(value: str | int | float, field: str = "cpu") -> int:
    return math.ceil(parse_quantity(value, field) * 1000)


def memory_mib(value: str | int | float, field: str = "memory") -> int:
    return math.ceil(parse_quantity(value, field) / (2**20))


def count(value: str | int | float, field: str) -> int:
    """A whole-number quantity such as an extended resource (``nvidia.com/gpu: 2``)."""
    number = parse_quantity(value, field)
    if number != number.to_integral_value() or number < 0:
        raise ValueError(f"{field}: expected a non-negative whole number, got {value!r}")
    return int(number)
