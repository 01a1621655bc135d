"""Wiring of the slicing service. For now it records unmet demand and inventory, which its layout planner will act on."""

from __future__ import annotations

from tessera.contracts import subjects
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.recording.service_layer import record
from tessera.core.recording.wiring import recording_service
from tessera.core.runner import ServiceContext, ServiceDefinition, serve
from tessera.slicing.adapters import orm
from tessera.slicing.config import SlicingSettings, get_settings
from tessera.slicing.service_layer.unit_of_work import SlicingUnitOfWork


def consumers() -> list[ConsumerSpec[SlicingUnitOfWork]]:
    return [
        ConsumerSpec("slicing-scheduler-events", "scheduler", "tessera.scheduler.evt.>", record),
        ConsumerSpec("slicing-inventory", "telemetry", subjects.INVENTORY_CHANGED, record),
    ]


def build(settings: SlicingSettings) -> ServiceDefinition[ServiceContext]:
    return recording_service(
        "slicing",
        outbox=orm.outbox,
        inbox=orm.inbox,
        unit_of_work=SlicingUnitOfWork,
        consumers=consumers(),
        observed_retention_h=settings.observed_retention_h,
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
