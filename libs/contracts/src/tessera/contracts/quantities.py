"""Kubernetes-style resource quantities, so job specs read like the pods users already write."""

from __future__ import annotations

import math
import re

_CPU = re.compile(r"^(?P<num>\d+(\.\d+)?)(?P<unit>m?)$")
_MEM = re.compile(r"^(?P<num>\d+(\.\d+)?)(?P<unit>Ki|Mi|Gi|Ti|K|M|G|T)?$")
MAX_CPU_MILLI = 1024 * 1000
"""At most 1,024 CPUs per pod: larger than any node, small enough for every sum kept."""
MAX_MEMORY_MIB = 16 * 1024 * 1024
"""At most 16 TiB per pod."""
_MEM_FACTORS_BYTES = {
    None: 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def _number(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:  # an int beyond any float
        return math.inf if value > 0 else -math.inf


def _finite(value: float, what: str, limit: float, limit_text: str) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite quantity")
    if value < 0:
        raise ValueError(f"{what} must not be negative")
    if value > limit:
        raise ValueError(f"{what} must be at most {limit_text} per pod")
    return value


def parse_cpu_milli(value: str | int | float) -> int:
    """`"500m"` -> 500, `"4"` -> 4000, `2.5` -> 2500. At most `MAX_CPU_MILLI`; never infinite."""
    if isinstance(value, bool):
        raise ValueError("cpu must be a quantity such as '500m' or '4', not a boolean")
    if isinstance(value, int | float):
        return round(_finite(_number(value) * 1000, "cpu", MAX_CPU_MILLI, "1024 CPUs"))
    match = _CPU.match(value.strip())
    if not match:
        raise ValueError(f"cpu {value!r} is not a quantity such as '500m' or '4'")
    num = float(match["num"])
    milli = num if match["unit"] == "m" else num * 1000
    return round(_finite(milli, "cpu", MAX_CPU_MILLI, "1024 CPUs"))


def parse_memory_mib(value: str | int | float) -> int:
    """`"16Gi"` -> 16384; a bare number is taken as bytes, as Kubernetes does. At most
    `MAX_MEMORY_MIB`; never infinite."""
    if isinstance(value, bool):
        raise ValueError("memory must be a quantity such as '16Gi', not a boolean")
    if isinstance(value, int | float):
        return int(_finite(_number(value) / 2**20, "memory", MAX_MEMORY_MIB, "16Ti"))
    match = _MEM.match(value.strip())
    if not match:
        raise ValueError(f"memory {value!r} is not a quantity such as '512Mi' or '16Gi'")
    mib = float(match["num"]) * _MEM_FACTORS_BYTES[match["unit"]] / 2**20
    return int(_finite(mib, "memory", MAX_MEMORY_MIB, "16Ti"))
