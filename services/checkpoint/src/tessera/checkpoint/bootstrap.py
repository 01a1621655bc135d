"""Wiring of the checkpoint service. For now it records placements, to know which jobs to checkpoint before a preemption."""

from __future__ import annotations

from tessera.checkpoint.adapters import orm
from tessera.checkpoint.config import CheckpointSettings, get_settings
from tessera.checkpoint.service_layer.unit_of_work import CheckpointUnitOfWork
from tessera.contracts import subjects
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.recording.service_layer import record
from tessera.core.recording.wiring import recording_service
from tessera.core.runner import ServiceContext, ServiceDefinition, serve


def consumers() -> list[ConsumerSpec[CheckpointUnitOfWork]]:
    return [ConsumerSpec("checkpoint-placements", "scheduler", subjects.GANG_PLACED, record)]


def build(settings: CheckpointSettings) -> ServiceDefinition[ServiceContext]:
    return recording_service(
        "checkpoint",
        outbox=orm.outbox,
        inbox=orm.inbox,
        unit_of_work=CheckpointUnitOfWork,
        consumers=consumers(),
        observed_retention_h=settings.observed_retention_h,
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
