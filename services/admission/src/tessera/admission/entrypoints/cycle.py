"""The admission cycle, a background task of the service."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from tessera.admission.service_layer.handlers import admit_fifo
from tessera.core.runner import ServiceContext

log = logging.getLogger(__name__)


async def admission_cycle(ctx: ServiceContext) -> None:
    interval = float(ctx.extras.get("cycle_interval_s", 0.2))
    while not ctx.stop.is_set():
        try:
            async with ctx.uow() as uow:
                admitted = await admit_fifo(uow)
                await uow.commit()
        except Exception:
            log.exception("admission cycle failed")
            admitted = []
        if not admitted:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ctx.stop.wait(), timeout=interval)
