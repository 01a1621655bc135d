"""The scheduling loop as the service's background task; with a cluster, it watches it first."""

from __future__ import annotations

import logging

from tessera.scheduler.service_layer.dependencies import SchedulerDeps

log = logging.getLogger(__name__)


async def scheduling_loop(deps: SchedulerDeps) -> None:
    """Run the engine until stop; with a cluster, wait for its first lists and watch it meanwhile."""
    engine, stop, connection = deps.engine, deps.ctx.stop, deps.cluster
    if connection is None:
        await engine.run(stop)
        return
    try:
        while not stop.is_set():
            try:
                await connection.side.start(timeout=engine.settings.cluster_sync_timeout_s)
                break
            except TimeoutError:
                log.warning("the cluster has not answered every list yet; still trying")
        log.info("watching the cluster")
        await engine.run(stop)
    finally:
        await connection.side.stop()
        await connection.cluster.close()
