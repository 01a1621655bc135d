"""The scheduling loop as the service's background task; with a kubeconfig, on the cluster."""

from __future__ import annotations

import logging
from collections.abc import Callable

from kubernetes.client import ApiClient

from tessera.cluster.kube import KubernetesCluster, api_client
from tessera.core.runner import BackgroundTask, ServiceContext
from tessera.scheduler.adapters.kube import JobMaterializer
from tessera.scheduler.service_layer.engine import SchedulingEngine
from tessera.scheduler.service_layer.rebuild import ClusterSide

log = logging.getLogger(__name__)

ENGINE = "engine"

# Turns the API client into the `Cluster` port; tests wrap the adapter to inject failures.
ClusterFactory = Callable[[ApiClient], KubernetesCluster]


def engine_of(ctx: ServiceContext) -> SchedulingEngine:
    engine = ctx.extras[ENGINE]
    assert isinstance(engine, SchedulingEngine)
    return engine


def scheduling_loop_on(cluster_factory: ClusterFactory | None = None) -> BackgroundTask:
    """The scheduling loop; with a kubeconfig it watches the cluster and binds on it."""

    async def scheduling_loop(ctx: ServiceContext) -> None:
        engine = engine_of(ctx)
        settings = engine.settings
        if settings.kubeconfig is None:
            await engine.run(ctx.stop)
            return
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
