"""The checkpoint service's background loops: time out overdue requests, act on node signals."""

from __future__ import annotations

import logging
from datetime import datetime

from tessera.checkpoint.service_layer.deadlines import expire_overdue
from tessera.checkpoint.service_layer.dependencies import CheckpointDeps
from tessera.checkpoint.service_layer.spot import reconcile_nodes
from tessera.core.waits import wait_any

log = logging.getLogger(__name__)

#: a failing round (the database restarting, say) waits this long before the next
RETRY_S = 1.0


async def time_out_requests(deps: CheckpointDeps) -> None:
    """Sleep until the next deadline (or `deadline_poll_s`, or a new request), then end what is due."""
    while not deps.stop.is_set():
        deps.deadline_wake.clear()  # before reading, so a request made meanwhile wakes the next wait
        timeout = deps.deadline_poll_s
        try:
            async with deps.uow() as uow:
                expired = await expire_overdue(uow, deps.clock())
                await uow.commit()
            if expired.more:
                continue
            timeout = _until(expired.next_deadline, deps.clock(), deps.deadline_poll_s)
        except Exception as exc:
            log.warning("deadline round failed", extra={"error": repr(exc)})
            timeout = RETRY_S
        await wait_any(deps.stop, deps.deadline_wake, timeout=timeout)


def _until(deadline: datetime | None, now: datetime, longest: float) -> float:
    if deadline is None:
        return longest
    return min(longest, max(0.0, (deadline - now).total_seconds()))


async def watch_nodes(deps: CheckpointDeps) -> None:
    """Ask the jobs on nodes about to go to checkpoint (bootstrap runs it only with a kubeconfig)."""
    nodes = deps.nodes
    if nodes is None:
        raise RuntimeError("no cluster to watch nodes on")
    try:
        while not deps.stop.is_set():
            try:
                await nodes.start()
                break
            except Exception as exc:  # the API server is not there yet: the watch keeps trying
                log.warning("waiting for the node list", extra={"error": repr(exc)})
                await wait_any(deps.stop, timeout=RETRY_S)
        while not deps.stop.is_set():
            await wait_any(deps.stop, nodes.changed, timeout=None)
            if deps.stop.is_set():
                break
            changed = nodes.take()
            try:
                async with deps.uow() as uow:
                    asked = await reconcile_nodes(uow, changed, deps.termination, deps.clock())
                    await uow.commit()
            except Exception as exc:
                log.warning("node signals not handled; retrying", extra={"error": repr(exc)})
                nodes.retry(set(changed))
                await wait_any(deps.stop, timeout=RETRY_S)
                continue
            if asked:
                deps.deadline_wake.set()
    finally:
        await nodes.stop()
