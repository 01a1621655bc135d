"""Wiring of the slicing service. For now it records unmet demand and inventory, which its layout planner will act on."""

from __future__ import annotations

from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.recorder import recording_handler
from tessera.core.runner import ServiceContext, ServiceDefinition, serve
from tessera.slicing.adapters import orm
from tessera.slicing.config import SlicingSettings, get_settings


def consumers(ctx: ServiceContext) -> list[ConsumerSpec]:
    c = ctx.settings.consumer
    record = recording_handler(orm.observed_events)
    return [
        ConsumerSpec.configured(
            "slicing-scheduler-events", "scheduler", "tessera.scheduler.evt.>", record, c
        ),
        ConsumerSpec.configured(
            "slicing-inventory", "telemetry", "tessera.telemetry.evt.inventory_changed", record, c
        ),
    ]


def build(settings: SlicingSettings) -> ServiceDefinition:
    return ServiceDefinition(
        name="slicing", metadata=orm.metadata, outbox=orm.outbox, inbox=orm.inbox, consumers=consumers
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
