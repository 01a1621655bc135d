"""Wiring of the admission service."""

from __future__ import annotations

import functools

from tessera.admission.adapters import orm
from tessera.admission.adapters.kube_jobsets import KubeCluster
from tessera.admission.config import AdmissionSettings, get_settings
from tessera.admission.entrypoints.api import router
from tessera.admission.entrypoints.config_api import router as config_router
from tessera.admission.entrypoints.cycle import admission_cycle
from tessera.admission.entrypoints.errors import install_error_handlers
from tessera.admission.entrypoints.reconcile import reconciliation
from tessera.admission.entrypoints.tenant_submit import tenant_submit_consumer
from tessera.admission.entrypoints.tokens_api import router as tokens_router
from tessera.admission.entrypoints.webhook import router as webhook_router
from tessera.admission.entrypoints.webhook_server import check_certificate, https_webhook
from tessera.admission.entrypoints.workloads import workload_sync
from tessera.admission.service_layer.dead_letters import reject_dead_lettered_submit
from tessera.admission.service_layer.dependencies import AdmissionDeps
from tessera.admission.service_layer.handlers import (
    handle_checkpoint_saved,
    handle_inventory,
    handle_outcome_command,
    handle_scheduler_event,
    handle_submit_command,
)
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork
from tessera.cluster.kube import api_client
from tessera.contracts import subjects
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.runner import ServiceContext, ServiceDefinition, serve


def consumers(deps: AdmissionDeps | None) -> list[ConsumerSpec[AdmissionUnitOfWork]]:
    return [
        ConsumerSpec(
            "admission-submit",
            "admission",
            subjects.SUBMIT_JOB,
            functools.partial(handle_submit_command, templates_required=deps.templates_required)
            if deps is not None and deps.templates_required
            else handle_submit_command,
            on_dead_letter=reject_dead_lettered_submit,
        ),
        # external publishers: each tenant on its own subject, its jobs only
        tenant_submit_consumer(deps is not None and deps.templates_required),
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
        cluster = None
        if settings.kubeconfig is not None:  # jobs run there as Kubernetes objects
            cluster = KubeCluster(api_client(kubeconfig=str(settings.kubeconfig)))
        return AdmissionDeps.from_settings(ctx, settings, cluster)

    https = []
    if settings.webhook.tls:  # a Kubernetes API server calls the webhook over TLS only
        check_certificate(settings.webhook)
        https.append(https_webhook(settings))
    return ServiceDefinition(
        name="admission",
        outbox=orm.outbox,
        inbox=orm.inbox,
        dependencies=dependencies,
        unit_of_work=AdmissionUnitOfWork,
        consumers=consumers,
        routers=[router, config_router, tokens_router, webhook_router],
        background=[admission_cycle, workload_sync, reconciliation, *https],
        configure_app=install_error_handlers,
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
