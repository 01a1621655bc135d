"""The admission cycle, a background task of the service.

A cycle runs when something may have changed: a submission or release in this process wakes
it at once; otherwise it polls the change sequence every `cycle_interval_s` (other replicas,
consumers), runs when a preemption deadline is due, and at least every `full_cycle_interval_s`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime

from sqlalchemy import text

from tessera.admission.service_layer.cycle import run_cycle
from tessera.core import faults
from tessera.core.runner import ServiceContext

log = logging.getLogger(__name__)


def wake_cycle(ctx: ServiceContext) -> None:
    event = ctx.extras.get("cycle_wake")
    if isinstance(event, asyncio.Event):
        event.set()


async def _change_mark(ctx: ServiceContext) -> int:
    async with ctx.engine.connect() as conn:
        return int((await conn.execute(text("SELECT last_value FROM admission.change_seq"))).scalar_one())


async def admission_cycle(ctx: ServiceContext) -> None:
    interval = float(ctx.extras.get("cycle_interval_s", 0.2))
    full_every = float(ctx.extras.get("full_cycle_interval_s", 10.0))
    wake = ctx.extras.setdefault("cycle_wake", asyncio.Event())
    assert isinstance(wake, asyncio.Event)
    last_mark: int | None = None
    last_full = 0.0
    next_deadline: datetime | None = None
    while not ctx.stop.is_set():
        woken = wake.is_set()
        wake.clear()
        try:
            mark = await _change_mark(ctx)
            due = next_deadline is not None and datetime.now(UTC) >= next_deadline
            if woken or due or mark != last_mark or time.monotonic() - last_full >= full_every:
                last_mark = mark
                last_full = time.monotonic()
                async with ctx.uow() as uow:
                    report = await run_cycle(
                        uow, before_commit=lambda: faults.hit("admission.cycle.before_commit")
                    )
                next_deadline = report.next_deadline
                if report.admitted or report.preemptions or report.released:
                    continue  # what was admitted may let more in (released victims, placements)
        except Exception:
            log.exception("admission cycle failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_either(ctx.stop, wake), timeout=interval)


async def _either(a: asyncio.Event, b: asyncio.Event) -> None:
    tasks = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
