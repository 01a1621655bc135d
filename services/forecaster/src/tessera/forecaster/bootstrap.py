"""Wiring of the forecaster service. For now it records telemetry samples, to build the load series it will forecast."""

from __future__ import annotations

from tessera.contracts import subjects
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.recording.service_layer import record
from tessera.core.recording.wiring import recording_service
from tessera.core.runner import ServiceContext, ServiceDefinition, serve
from tessera.forecaster.adapters import orm
from tessera.forecaster.config import ForecasterSettings, get_settings
from tessera.forecaster.service_layer.unit_of_work import ForecasterUnitOfWork


def consumers() -> list[ConsumerSpec[ForecasterUnitOfWork]]:
    return [ConsumerSpec("forecaster-gpu-samples", "telemetry", subjects.ALL_GPU_SAMPLES, record)]


def build(settings: ForecasterSettings) -> ServiceDefinition[ServiceContext]:
    return recording_service(
        "forecaster",
        outbox=orm.outbox,
        inbox=orm.inbox,
        unit_of_work=ForecasterUnitOfWork,
        consumers=consumers(),
        observed_retention_h=settings.observed_retention_h,
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
