"""Wiring of the scheduler service: consumers, the scheduling loop, and the cluster when configured."""

from __future__ import annotations

from tessera.contracts import subjects
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.runner import ServiceContext, ServiceDefinition, serve
from tessera.scheduler.adapters import orm
from tessera.scheduler.config import SchedulerSettings, get_settings
from tessera.scheduler.entrypoints.loop import ENGINE, ClusterFactory, engine_of, scheduling_loop_on
from tessera.scheduler.service_layer.engine import SchedulingEngine
from tessera.scheduler.service_layer.handlers import (
    gpu_unhealthy_handler,
    inventory_changed_handler,
    job_admitted_handler,
    job_finished_handler,
    preemption_requested_handler,
)


async def on_start(ctx: ServiceContext) -> None:
    settings = ctx.settings
    assert isinstance(settings, SchedulerSettings)
    ctx.extras[ENGINE] = SchedulingEngine(ctx.uow, settings)


def consumers(ctx: ServiceContext) -> list[ConsumerSpec]:
    c = ctx.settings.consumer
    engine = engine_of(ctx)
    return [
        ConsumerSpec.configured(
            "scheduler-admitted", "admission", subjects.JOB_ADMITTED, job_admitted_handler(engine), c
        ),
        ConsumerSpec.configured(
            "scheduler-inventory",
            "telemetry",
            subjects.INVENTORY_CHANGED,
            inventory_changed_handler(engine),
            c,
        ),
        ConsumerSpec.configured(
            "scheduler-gpu-health", "telemetry", subjects.GPU_UNHEALTHY, gpu_unhealthy_handler(engine), c
        ),
        ConsumerSpec.configured(
            "scheduler-preemption",
            "admission",
            subjects.PREEMPTION_REQUESTED,
            preemption_requested_handler(engine),
            c,
        ),
        ConsumerSpec.configured(
            "scheduler-job-finished", "admission", subjects.JOB_FINISHED, job_finished_handler(engine), c
        ),
    ]


def build(settings: SchedulerSettings, *, cluster_factory: ClusterFactory | None = None) -> ServiceDefinition:
    return ServiceDefinition(
        name="scheduler",
        metadata=orm.metadata,
        outbox=orm.outbox,
        inbox=orm.inbox,
        consumers=consumers,
        background=[scheduling_loop_on(cluster_factory)],
        on_start=on_start,
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
