"""Wiring of the admission service."""

from __future__ import annotations

from tessera.admission.adapters import orm
from tessera.admission.config import AdmissionSettings, get_settings
from tessera.admission.entrypoints.api import router
from tessera.admission.entrypoints.config_api import router as config_router
from tessera.admission.entrypoints.cycle import admission_cycle
from tessera.admission.entrypoints.errors import install_error_handlers
from tessera.admission.service_layer.dependencies import AdmissionDeps
from tessera.admission.service_layer.handlers import (
    handle_checkpoint_saved,
    handle_inventory,
    handle_outcome_command,
    handle_scheduler_event,
    handle_submit_command,
)
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork
from tessera.contracts import subjects
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.runner import ServiceContext, ServiceDefinition, serve


def consumers(deps: AdmissionDeps) -> list[ConsumerSpec[AdmissionUnitOfWork]]:
    return [
        ConsumerSpec("admission-submit", "admission", subjects.SUBMIT_JOB, handle_submit_command),
        ConsumerSpec("admission-outcomes", "admission", subjects.REPORT_JOB_OUTCOME, handle_outcome_command),
        ConsumerSpec(
            "admission-scheduler-outcomes", "scheduler", "tessera.scheduler.evt.>", handle_scheduler_event
        ),
        ConsumerSpec("admission-inventory", "telemetry", subjects.INVENTORY_CHANGED, handle_inventory),
        ConsumerSpec(
            "admission-checkpoints", "checkpoint", subjects.CHECKPOINT_SAVED, handle_checkpoint_saved
        ),
    ]


def build(settings: AdmissionSettings) -> ServiceDefinition[AdmissionDeps]:
    async def dependencies(ctx: ServiceContext) -> AdmissionDeps:
        return AdmissionDeps.from_settings(ctx, settings)

    return ServiceDefinition(
        name="admission",
        outbox=orm.outbox,
        inbox=orm.inbox,
        dependencies=dependencies,
        unit_of_work=AdmissionUnitOfWork,
        consumers=consumers,
        routers=[router, config_router],
        background=[admission_cycle],
        configure_app=install_error_handlers,
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
