"""Wiring of the forecaster service. For now it records telemetry samples, to build the load series it will forecast."""

from __future__ import annotations

from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.recorder import recording_handler
from tessera.core.runner import ServiceContext, ServiceDefinition, context_only, serve
from tessera.forecaster.adapters import orm
from tessera.forecaster.config import ForecasterSettings, get_settings


def consumers(ctx: ServiceContext) -> list[ConsumerSpec[UnitOfWork]]:
    record = recording_handler(orm.observed_events)
    return [
        ConsumerSpec("forecaster-gpu-samples", "telemetry", "tessera.telemetry.gpu.*", record),
    ]


def build(settings: ForecasterSettings) -> ServiceDefinition[ServiceContext]:
    return ServiceDefinition(
        name="forecaster",
        outbox=orm.outbox,
        inbox=orm.inbox,
        dependencies=context_only,
        consumers=consumers,
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
