"""Wiring of the admission service."""

from __future__ import annotations

from tessera.admission.adapters import orm
from tessera.admission.config import AdmissionSettings, get_settings
from tessera.admission.entrypoints.api import router
from tessera.admission.entrypoints.cycle import admission_cycle
from tessera.admission.service_layer.handlers import handle_scheduler_event, handle_submit_command
from tessera.contracts import subjects
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.runner import ServiceContext, ServiceDefinition, serve


def consumers(ctx: ServiceContext) -> list[ConsumerSpec]:
    c = ctx.settings.consumer
    return [
        ConsumerSpec.configured(
            "admission-submit", "admission", subjects.SUBMIT_JOB, handle_submit_command, c
        ),
        ConsumerSpec.configured(
            "admission-scheduler-outcomes", "scheduler", "tessera.scheduler.evt.>", handle_scheduler_event, c
        ),
    ]


async def on_start(ctx: ServiceContext) -> None:
    settings = ctx.settings
    assert isinstance(settings, AdmissionSettings)
    ctx.extras["cycle_interval_s"] = settings.cycle_interval_s


def build(settings: AdmissionSettings) -> ServiceDefinition:
    return ServiceDefinition(
        name="admission",
        metadata=orm.metadata,
        outbox=orm.outbox,
        inbox=orm.inbox,
        consumers=consumers,
        routers=[router],
        background=[admission_cycle],
        on_start=on_start,
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
