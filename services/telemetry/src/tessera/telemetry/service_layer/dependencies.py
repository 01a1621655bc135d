"""What telemetry's background tasks share, built once in `bootstrap.py`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tessera.core.runner import ServiceContext
from tessera.telemetry.domain.model import GpuSource
from tessera.telemetry.domain.monitor import Monitor
from tessera.telemetry.service_layer.unit_of_work import TelemetryUnitOfWork


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

    def uow(self) -> TelemetryUnitOfWork:
        uow: TelemetryUnitOfWork = self.ctx.uow()
        return uow
