"""What the checkpoint service's handlers, loops and routes share, built once in `bootstrap.py`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from tessera.checkpoint.domain.signals import NodeState, TerminationPolicy
from tessera.checkpoint.service_layer.unit_of_work import CheckpointUnitOfWork
from tessera.core.tenant_tokens import TenantTokens


def utc_now() -> datetime:
    return datetime.now(UTC)


class NodeWatch(Protocol):
    """The cluster's nodes, watched; level-triggered: it says which nodes changed, not how."""

    changed: asyncio.Event
    """Set while some node changed and was not taken yet."""

    async def start(self) -> None:
        """Start watching and wait for the first list (every node then counts as changed)."""
        ...

    async def stop(self) -> None: ...

    def take(self) -> Mapping[str, NodeState | None]:
        """The nodes changed since the last take, as they are now (None: deleted); clears `changed`."""
        ...

    def retry(self, names: set[str]) -> None:
        """Count these nodes as changed again (handling them failed)."""
        ...


@dataclass
class CheckpointDeps:
    uow: Callable[[], CheckpointUnitOfWork]
    stop: asyncio.Event
    termination: TerminationPolicy
    nodes: NodeWatch | None
    deadline_poll_s: float
    clock: Callable[[], datetime] = utc_now
    #: set after a commit that made a request, so the deadline loop looks at its deadline
    deadline_wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: who a bearer token reads for (admission says); by default only a configured admin token reads
    tokens: TenantTokens = field(default_factory=TenantTokens)
