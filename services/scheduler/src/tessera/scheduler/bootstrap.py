"""Wiring of the scheduler service."""

from __future__ import annotations

from tessera.contracts import subjects
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.runner import ServiceContext, ServiceDefinition, serve
from tessera.scheduler.adapters import orm
from tessera.scheduler.config import SchedulerSettings, get_settings
from tessera.scheduler.service_layer.handlers import handle_inventory_changed, handle_job_admitted


def consumers(ctx: ServiceContext) -> list[ConsumerSpec]:
    c = ctx.settings.consumer
    return [
        ConsumerSpec.configured(
            "scheduler-admitted", "admission", subjects.JOB_ADMITTED, handle_job_admitted, c
        ),
        ConsumerSpec.configured(
            "scheduler-inventory", "telemetry", subjects.INVENTORY_CHANGED, handle_inventory_changed, c
        ),
    ]


def build(settings: SchedulerSettings) -> ServiceDefinition:
    return ServiceDefinition(
        name="scheduler", metadata=orm.metadata, outbox=orm.outbox, inbox=orm.inbox, consumers=consumers
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
