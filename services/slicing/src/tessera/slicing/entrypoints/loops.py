"""The slicing service's background loops: plan layouts from the demand window, drive operations."""

from __future__ import annotations

import asyncio
import logging

from tessera.core.waits import wait_any
from tessera.slicing.service_layer.dependencies import SlicingDeps
from tessera.slicing.service_layer.operating import open_operations, step
from tessera.slicing.service_layer.planning import Planning, plan_round, read_signals

log = logging.getLogger(__name__)

#: a failing round (the API server or the database away) waits this long before the next
RETRY_S = 1.0


async def plan_layouts(deps: SlicingDeps) -> None:
    """Feed the window with what was recorded; when it closes, plan (bootstrap runs it with a cluster).
    With leader election, only the holder of the Lease plans; the others wait to take over."""
    planning = deps.planning
    if planning is None:
        raise RuntimeError("no cluster to plan layouts for")
    if deps.leader is None:
        await _plan_until(deps, planning, deps.stop)
        return

    async def lead(lost: asyncio.Event) -> None:
        log.info("leading: planning layouts", extra={"identity": deps.leader and deps.leader.identity})
        await _plan_until(deps, planning, lost)
        log.info("no longer leading: planning stops")

    await deps.leader.run(deps.stop, lead)


async def _plan_until(deps: SlicingDeps, planning: Planning, until: asyncio.Event) -> None:
    while not (deps.stop.is_set() or until.is_set()):
        timeout = deps.tick_s
        try:
            while await read_signals(planning):
                pass
            if await plan_round(planning) and deps.wake is not None:
                deps.wake.set()
        except Exception as exc:
            log.warning("planning round failed", extra={"error": repr(exc)})
            timeout = RETRY_S
        await wait_any(deps.stop, until, timeout=timeout)


async def drive_operations(deps: SlicingDeps) -> None:
    """Take every open operation as far as it can go now, then wait a tick (or a new plan)."""
    operator = deps.operator
    if operator is None:
        raise RuntimeError("no cluster to operate on")
    while not deps.stop.is_set():
        timeout = deps.tick_s
        if deps.wake is not None:
            deps.wake.clear()
        try:
            for operation_id in await open_operations(operator):
                while not deps.stop.is_set() and await step(operator, operation_id):
                    pass
        except Exception as exc:
            log.warning("operation round failed", extra={"error": repr(exc)})
            timeout = RETRY_S
        waits = [deps.stop] if deps.wake is None else [deps.stop, deps.wake]
        await wait_any(*waits, timeout=timeout)
