"""Wiring of the checkpoint service. For now it records placements, to know which jobs to checkpoint before a preemption."""

from __future__ import annotations

from tessera.checkpoint.adapters import orm
from tessera.checkpoint.config import CheckpointSettings, get_settings
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.recorder import recording_handler
from tessera.core.runner import ServiceContext, ServiceDefinition, serve


def consumers(ctx: ServiceContext) -> list[ConsumerSpec]:
    c = ctx.settings.consumer
    record = recording_handler(orm.observed_events)
    return [
        ConsumerSpec.configured(
            "checkpoint-placements", "scheduler", "tessera.scheduler.evt.gang_placed", record, c
        ),
    ]


def build(settings: CheckpointSettings) -> ServiceDefinition:
    return ServiceDefinition(
        name="checkpoint", metadata=orm.metadata, outbox=orm.outbox, inbox=orm.inbox, consumers=consumers
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
