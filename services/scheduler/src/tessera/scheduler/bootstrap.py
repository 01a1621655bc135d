"""Wiring of the scheduler service: consumers, the scheduling loop, and the cluster when configured."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tessera.contracts import subjects
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.runner import BackgroundTask, ServiceContext, ServiceDefinition, serve
from tessera.scheduler.adapters import orm
from tessera.scheduler.config import SchedulerSettings, get_settings
from tessera.scheduler.service_layer.engine import SchedulingEngine
from tessera.scheduler.service_layer.handlers import (
    gpu_unhealthy_handler,
    inventory_changed_handler,
    job_admitted_handler,
    job_finished_handler,
    preemption_requested_handler,
)

log = logging.getLogger(__name__)

ENGINE = "engine"


def engine_of(ctx: ServiceContext) -> SchedulingEngine:
    engine = ctx.extras[ENGINE]
    assert isinstance(engine, SchedulingEngine)
    return engine


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


ClusterFactory = Callable[[Any], Any]


def scheduling_loop_on(cluster_factory: ClusterFactory | None = None) -> BackgroundTask:
    """The scheduling loop; with a kubeconfig it watches the cluster and binds on it.

    ``cluster_factory`` turns the API client into the `Cluster` port (the Kubernetes adapter by
    default; tests wrap it to inject failures).
    """

    async def scheduling_loop(ctx: ServiceContext) -> None:
        engine = engine_of(ctx)
        settings = engine.settings
        if settings.kubeconfig is None:
            await engine.run(ctx.stop)
            return
        from tessera.cluster.kube import KubernetesCluster, api_client
        from tessera.scheduler.adapters.kube import JobMaterializer
        from tessera.scheduler.service_layer.rebuild import ClusterSide

        api = api_client(kubeconfig=str(settings.kubeconfig))
        cluster = (cluster_factory or KubernetesCluster)(api)
        side = ClusterSide(cluster, JobMaterializer(api), engine.on_watch)
        engine.cluster = side
        try:
            while not ctx.stop.is_set():
                try:
                    await side.start(timeout=settings.cluster_sync_timeout_s)
                    break
                except TimeoutError:
                    log.warning(
                        "the cluster has not answered every list yet; still trying",
                        extra={"kubeconfig": str(settings.kubeconfig)},
                    )
            log.info("watching the cluster", extra={"kubeconfig": str(settings.kubeconfig)})
            await engine.run(ctx.stop)
        finally:
            await side.stop()
            await cluster.close()

    return scheduling_loop


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
