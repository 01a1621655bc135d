"""Wiring of the checkpoint service. For now it records placements, to know which jobs to checkpoint before a preemption."""

from __future__ import annotations

from tessera.checkpoint.adapters import orm
from tessera.checkpoint.config import CheckpointSettings, get_settings
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.recorder import recording_handler
from tessera.core.runner import ServiceContext, ServiceDefinition, context_only, serve


def consumers(ctx: ServiceContext) -> list[ConsumerSpec[UnitOfWork]]:
    record = recording_handler(orm.observed_events)
    return [
        ConsumerSpec("checkpoint-placements", "scheduler", "tessera.scheduler.evt.gang_placed", record),
    ]


def build(settings: CheckpointSettings) -> ServiceDefinition[ServiceContext]:
    return ServiceDefinition(
        name="checkpoint",
        outbox=orm.outbox,
        inbox=orm.inbox,
        dependencies=context_only,
        consumers=consumers,
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
