"""The scheduling loop as the service's background task; with a cluster, it watches it first.

With a kubeconfig and leader election on (the default), replicas contend for a Lease and only the
leader runs the loop; the others keep watching the cluster (so a takeover starts from a warm
cache) and keep their consumers, which only record what arrives. A leader that loses the lease
finishes the cycle it is in and stops deciding; the next time it leads, it rebuilds its state.
"""

from __future__ import annotations

import asyncio
import logging

from tessera.core.waits import wait_any
from tessera.scheduler.service_layer.dependencies import SchedulerDeps

log = logging.getLogger(__name__)


async def scheduling_loop(deps: SchedulerDeps) -> None:
    """Run the engine until stop (while leading, when elected); with a cluster, wait for its first
    lists and watch it meanwhile."""
    engine, stop, connection = deps.engine, deps.ctx.stop, deps.cluster
    try:
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
            if connection.leader is None:
                await engine.run(stop)
                return

            async def lead(lost: asyncio.Event) -> None:
                """Decide until the lease is lost or the service stops."""
                leading = asyncio.Event()
                relay = asyncio.ensure_future(_either(stop, lost, leading))
                try:
                    await engine.run(leading)
                finally:
                    relay.cancel()

            await connection.leader.run(stop, lead)
        finally:
            await connection.side.stop()
            await connection.cluster.close()
    finally:
        engine.close()


async def _either(stop: asyncio.Event, lost: asyncio.Event, then: asyncio.Event) -> None:
    await wait_any(stop, lost, timeout=None)
    then.set()
