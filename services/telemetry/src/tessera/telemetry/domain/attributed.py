"""A round of readings with each GPU's reading split among its holders. Pure."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tessera.telemetry.domain.attribution import Share
from tessera.telemetry.domain.model import Reading

#: (namespace, pod name, GPU uuid) -> the milli-GPU the scheduler placed, when it did
PlacedMilli = Callable[[str, str, str], int | None]


@dataclass(frozen=True)
class AttributedGpu:
    reading: Reading
    shares: list[Share]


@dataclass
class Attributed:
    gpus: list[AttributedGpu] = field(default_factory=list)
    #: nodes attributed from the source's own holders, PodResources being unavailable there
    fallback_nodes: list[str] = field(default_factory=list)
    #: node -> why its PodResources could not be read
    problems: dict[str, str] = field(default_factory=dict)
    #: grants of MIG devices that no reading names
    unresolved: int = 0


class Attributor(Protocol):
    def attribute(
        self,
        readings: Sequence[Reading],
        placed_milli: PlacedMilli | None = None,
        placements: int | None = None,
    ) -> Awaitable[Attributed]:
        """Split each reading among its GPU's holders; `placements` changes whenever what
        `placed_milli` answers may (None: it may change at any time)."""
        ...

    async def close(self) -> None: ...
