"""What telemetry's background tasks share, built once in `bootstrap.py`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tessera.core.runner import ServiceContext
from tessera.core.tenant_tokens import TenantTokens
from tessera.telemetry.domain.attributed import Attributor
from tessera.telemetry.domain.model import GpuSource
from tessera.telemetry.domain.monitor import Monitor
from tessera.telemetry.service_layer.unit_of_work import TelemetryUnitOfWork
from tessera.telemetry.service_layer.usage import UsageLedger


@dataclass
class Telemetry:
    ctx: ServiceContext
    source: GpuSource
    monitor: Monitor
    sample_interval_s: float
    inventory_interval_s: float
    inventory_republish_s: float
    #: set when GPU health changed, so the inventory is announced now rather than on its next round
    inventory_due: asyncio.Event = field(default_factory=asyncio.Event)
    restored: asyncio.Event = field(default_factory=asyncio.Event)
    #: usage and cost accounting; None when it is off
    ledger: UsageLedger | None = None
    attributor: Attributor | None = None
    usage_flush_s: float = 30.0
    #: the nodes whose stored usage this instance continues after a restart (None: every node)
    usage_nodes: list[str] | None = None
    #: the nodes whose own sources stand in for PodResources, and why: a readiness condition
    attribution_problems: dict[str, str] = field(default_factory=dict)
    #: whose usage GET /v1/usage shows, as admission says; by default only a configured admin token reads
    tokens: TenantTokens = field(default_factory=TenantTokens)
    currency: str = "USD"

    def uow(self) -> TelemetryUnitOfWork:
        uow: TelemetryUnitOfWork = self.ctx.uow()
        return uow
