"""Wiring of the admission service."""

from __future__ import annotations

from fastapi import FastAPI

from tessera.admission.adapters import orm
from tessera.admission.config import AdmissionSettings, get_settings
from tessera.admission.entrypoints.api import router
from tessera.admission.entrypoints.config_api import router as config_router
from tessera.admission.entrypoints.cycle import admission_cycle
from tessera.admission.entrypoints.errors import install_error_handlers
from tessera.admission.service_layer.handlers import (
    handle_inventory,
    handle_outcome_command,
    handle_scheduler_event,
    handle_submit_command,
)
from tessera.contracts import subjects
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.runner import ServiceContext, ServiceDefinition, create_app


def consumers(ctx: ServiceContext) -> list[ConsumerSpec]:
    c = ctx.settings.consumer
    return [
        ConsumerSpec.configured(
            "admission-submit", "admission", subjects.SUBMIT_JOB, handle_submit_command, c
        ),
        ConsumerSpec.configured(
            "admission-outcomes", "admission", subjects.REPORT_JOB_OUTCOME, handle_outcome_command, c
        ),
        ConsumerSpec.configured(
            "admission-scheduler-outcomes", "scheduler", "tessera.scheduler.evt.>", handle_scheduler_event, c
        ),
        ConsumerSpec.configured(
            "admission-inventory", "telemetry", subjects.INVENTORY_CHANGED, handle_inventory, c
        ),
    ]


async def on_start(ctx: ServiceContext) -> None:
    settings = ctx.settings
    assert isinstance(settings, AdmissionSettings)
    ctx.extras["cycle_interval_s"] = settings.cycle_interval_s
    ctx.extras["full_cycle_interval_s"] = settings.full_cycle_interval_s
    ctx.extras["auth"] = settings.auth
    ctx.extras["admin_token"] = settings.admin_token


def build(settings: AdmissionSettings) -> ServiceDefinition:
    return ServiceDefinition(
        name="admission",
        metadata=orm.metadata,
        outbox=orm.outbox,
        inbox=orm.inbox,
        consumers=consumers,
        routers=[router, config_router],
        background=[admission_cycle],
        on_start=on_start,
    )


def create_admission_app(settings: AdmissionSettings) -> FastAPI:
    """The service's FastAPI app, with structured error bodies for every error status."""
    app = create_app(build(settings), settings)
    install_error_handlers(app)
    return app


def main() -> None:
    import uvicorn

    from tessera.core.observability.logs import configure_logging
    from tessera.core.observability.tracing import configure_tracing

    settings = get_settings()
    configure_logging("admission", settings.log_level)
    configure_tracing("admission")
    uvicorn.run(
        create_admission_app(settings),
        host=settings.http_host,
        port=settings.http_port,
        log_config=None,
        timeout_graceful_shutdown=int(settings.shutdown_grace_s),
    )
