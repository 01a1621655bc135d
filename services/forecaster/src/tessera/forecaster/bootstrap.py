"""Wiring of the forecaster service. For now it records telemetry samples, to build the load series it will forecast."""

from __future__ import annotations

from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.recorder import recording_handler
from tessera.core.runner import ServiceContext, ServiceDefinition, serve
from tessera.forecaster.adapters import orm
from tessera.forecaster.config import ForecasterSettings, get_settings


def consumers(ctx: ServiceContext) -> list[ConsumerSpec]:
    c = ctx.settings.consumer
    record = recording_handler(orm.observed_events)
    return [
        ConsumerSpec.configured("forecaster-gpu-samples", "telemetry", "tessera.telemetry.gpu.*", record, c),
    ]


def build(settings: ForecasterSettings) -> ServiceDefinition:
    return ServiceDefinition(
        name="forecaster", metadata=orm.metadata, outbox=orm.outbox, inbox=orm.inbox, consumers=consumers
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
