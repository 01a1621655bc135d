"""Wiring of the slicing service. For now it records unmet demand and inventory, which its layout planner will act on."""

from __future__ import annotations

from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.recorder import recording_handler
from tessera.core.runner import ServiceContext, ServiceDefinition, context_only, serve
from tessera.slicing.adapters import orm
from tessera.slicing.config import SlicingSettings, get_settings


def consumers(ctx: ServiceContext) -> list[ConsumerSpec[UnitOfWork]]:
    record = recording_handler(orm.observed_events)
    return [
        ConsumerSpec("slicing-scheduler-events", "scheduler", "tessera.scheduler.evt.>", record),
        ConsumerSpec("slicing-inventory", "telemetry", "tessera.telemetry.evt.inventory_changed", record),
    ]


def build(settings: SlicingSettings) -> ServiceDefinition[ServiceContext]:
    return ServiceDefinition(
        name="slicing",
        outbox=orm.outbox,
        inbox=orm.inbox,
        dependencies=context_only,
        consumers=consumers,
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
