"""Wiring of the checkpoint service."""

from __future__ import annotations

from tessera.checkpoint.adapters import orm
from tessera.checkpoint.adapters.nodes import KubeNodeWatch
from tessera.checkpoint.config import CheckpointSettings, get_settings
from tessera.checkpoint.entrypoints.api import router
from tessera.checkpoint.entrypoints.loops import time_out_requests, watch_nodes
from tessera.checkpoint.service_layer import handlers as on
from tessera.checkpoint.service_layer.dependencies import CheckpointDeps
from tessera.checkpoint.service_layer.unit_of_work import CheckpointUnitOfWork
from tessera.contracts import subjects
from tessera.core.db.retention import RetentionRule
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.runner import ServiceContext, ServiceDefinition, serve

#: name, stream owner, subject, handler. Reports only: the save commands this service sends to trainers
#: (`cmd.save.<job>`, one token more) share its stream but not this subject.
CONSUMERS = [
    ("reports", "checkpoint", subjects.REPORT_CHECKPOINT, on.on_report_checkpoint),
    ("preemptions", "admission", subjects.PREEMPTION_REQUESTED, on.on_preemption_requested),
    ("admitted", "admission", subjects.JOB_ADMITTED, on.on_job_admitted),
    ("jobs-finished", "admission", subjects.JOB_FINISHED, on.on_job_finished),
    ("placements", "scheduler", subjects.GANG_PLACED, on.on_gang_placed),
    ("gangs-finished", "scheduler", subjects.GANG_FINISHED, on.on_gang_finished),
]


def consumers(deps: CheckpointDeps) -> list[ConsumerSpec[CheckpointUnitOfWork]]:
    return [
        ConsumerSpec(f"checkpoint-{name}", owner, subject, on(deps)) for name, owner, subject, on in CONSUMERS
    ]


def build(settings: CheckpointSettings) -> ServiceDefinition[CheckpointDeps]:
    async def dependencies(ctx: ServiceContext) -> CheckpointDeps:
        kubeconfig, spot = settings.kubeconfig, settings.spot
        nodes = KubeNodeWatch(kubeconfig, sync_timeout_s=spot.sync_timeout_s) if kubeconfig else None
        return CheckpointDeps(
            ctx.uow, ctx.stop, spot.policy(), nodes, settings.deadline_poll_s, tokens=settings.tokens()
        )

    history_s = settings.history_retention_h * 3600
    return ServiceDefinition(
        name="checkpoint",
        outbox=orm.outbox,
        inbox=orm.inbox,
        unit_of_work=CheckpointUnitOfWork,
        dependencies=dependencies,
        consumers=consumers,
        routers=[router],
        # A finished task makes the service unready: the node watch runs only with a cluster to watch.
        background=[time_out_requests, *([watch_nodes] if settings.kubeconfig else [])],
        retention=[
            RetentionRule(orm.checkpoint_requests, "updated_at", history_s),
            RetentionRule(orm.jobs, "finished_at", history_s),
            RetentionRule(orm.checkpoints, "saved_at", settings.checkpoints_retention_h * 3600),
        ],
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
