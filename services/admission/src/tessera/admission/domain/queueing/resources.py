"""Resource names and the small arithmetic on per-(flavor, resource) quantities.

Quantities are integers in fixed units: `gpu` whole GPUs, `gpu-milli` thousandths of one GPU,
`mig-<profile>` MIG slices (e.g. `mig-1g.10gb`), `cpu` milli-CPU, `memory` MiB.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

GPU = "gpu"
GPU_MILLI = "gpu-milli"
CPU = "cpu"
MEMORY = "memory"
MIG_PREFIX = "mig-"

FlavorResource = tuple[str, str]
"""(flavor, resource): the unit quota is kept in, e.g. ("a100-80gb", "gpu")."""


def mig_resource(profile: str) -> str:
    """The resource name of a MIG profile: `1g.10gb` -> `mig-1g.10gb`."""
    return f"{MIG_PREFIX}{profile}"


def is_known_resource(name: str) -> bool:
    return name in (GPU, GPU_MILLI, CPU, MEMORY) or (name.startswith(MIG_PREFIX) and len(name) > 4)


def add_into(target: dict[FlavorResource, int], extra: Mapping[FlavorResource, int], sign: int = 1) -> None:
    for key, value in extra.items():
        target[key] = target.get(key, 0) + sign * value


def total(parts: Iterable[Mapping[FlavorResource, int]]) -> dict[FlavorResource, int]:
    out: dict[FlavorResource, int] = {}
    for part in parts:
        add_into(out, part)
    return out
