"""Kubernetes-style resource quantities, so job specs read like the pods users already write."""

from __future__ import annotations

import re

_CPU = re.compile(r"^(?P<num>\d+(\.\d+)?)(?P<unit>m?)$")
_MEM = re.compile(r"^(?P<num>\d+(\.\d+)?)(?P<unit>Ki|Mi|Gi|Ti|K|M|G|T)?$")
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


def parse_cpu_milli(value: str | int | float) -> int:
    """`"500m"` -> 500, `"4"` -> 4000, `2.5` -> 2500."""
    if isinstance(value, bool):
        raise ValueError("cpu must be a quantity such as '500m' or '4', not a boolean")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("cpu must not be negative")
        return round(value * 1000)
    match = _CPU.match(value.strip())
    if not match:
        raise ValueError(f"cpu {value!r} is not a quantity such as '500m' or '4'")
    num = float(match["num"])
    return round(num) if match["unit"] == "m" else round(num * 1000)


def parse_memory_mib(value: str | int | float) -> int:
    """`"16Gi"` -> 16384; a bare number is taken as bytes, as Kubernetes does."""
    if isinstance(value, bool):
        raise ValueError("memory must be a quantity such as '16Gi', not a boolean")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("memory must not be negative")
        return int(value // 2**20)
    match = _MEM.match(value.strip())
    if not match:
        raise ValueError(f"memory {value!r} is not a quantity such as '512Mi' or '16Gi'")
    return int(float(match["num"]) * _MEM_FACTORS_BYTES[match["unit"]] // 2**20)
