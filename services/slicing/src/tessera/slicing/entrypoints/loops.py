"""The slicing service's background loops: plan layouts from the demand window, drive operations."""

from __future__ import annotations

import asyncio
import logging
import time

from tessera.core.observability.ratelimit import RateLimitedLog
from tessera.core.waits import wait_any
from tessera.slicing.service_layer.dependencies import SlicingDeps
from tessera.slicing.service_layer.operating import open_operations, step
from tessera.slicing.service_layer.planning import Planning, plan_round, read_signals

log = logging.getLogger(__name__)

#: a failing round (the API server or the database away) waits this long before the next, and a
#: failing operation this long before its next try
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
    """Take every open operation as far as it can go now, then wait a tick (or a new plan). A step
    that fails holds back only its own operation, for RETRY_S; the others go on moving."""
    operator = deps.operator
    if operator is None:
        raise RuntimeError("no cluster to operate on")
    failures = RateLimitedLog(log)
    held_back: dict[str, float] = {}  # operation -> monotonic time its next try is due
    while not deps.stop.is_set():
        timeout = deps.tick_s
        if deps.wake is not None:
            deps.wake.clear()
        try:
            operation_ids = await open_operations(operator)
        except Exception as exc:
            failures.warning(
                f"round:{type(exc).__name__}", "listing open operations failed", extra={"error": repr(exc)}
            )
            operation_ids, timeout = [], RETRY_S
        held_back = {k: due for k, due in held_back.items() if k in operation_ids}
        for operation_id in operation_ids:
            if deps.stop.is_set():
                break
            if held_back.get(operation_id, 0.0) > time.monotonic():
                continue
            try:
                while not deps.stop.is_set() and await step(operator, operation_id):
                    pass
            except Exception as exc:
                held_back[operation_id] = time.monotonic() + RETRY_S
                failures.warning(
                    f"step:{operation_id}:{type(exc).__name__}",
                    "slicing operation step failed; it is retried",
                    extra={"operation": operation_id, "error": repr(exc)},
                    exc_info=True,
                )
            else:
                held_back.pop(operation_id, None)
        waits = [deps.stop] if deps.wake is None else [deps.stop, deps.wake]
        await wait_any(*waits, timeout=timeout)
