"""Background tasks: the inventory announcer and the sample publisher."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime, timedelta

from tessera.contracts.events import GpuSample
from tessera.core.messaging.envelope import encode
from tessera.core.runner import ServiceContext
from tessera.telemetry.domain.model import GpuSource
from tessera.telemetry.service_layer.handlers import sync_inventory

log = logging.getLogger(__name__)


def _source(ctx: ServiceContext) -> GpuSource:
    source: GpuSource = ctx.extras["source"]
    return source


async def _sleep(ctx: ServiceContext, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ctx.stop.wait(), timeout=seconds)


async def announce_inventory(ctx: ServiceContext) -> None:
    interval = float(ctx.extras["inventory_interval_s"])
    republish = timedelta(seconds=float(ctx.extras["inventory_republish_s"]))
    while not ctx.stop.is_set():
        source = _source(ctx)
        try:
            async with ctx.uow() as uow:
                if await sync_inventory(uow, source.name, source.inventory(), republish):
                    log.info("inventory announced", extra={"source": source.name})
                await uow.commit()
        except Exception:
            log.exception("inventory announcement failed")
        await _sleep(ctx, interval)


async def publish_samples(ctx: ServiceContext) -> None:
    """Samples go straight to JetStream, not through the outbox: they are many, short-lived, and a lost
    sample is replaced by the next one."""
    interval = float(ctx.extras["sample_interval_s"])
    while not ctx.stop.is_set():
        now = datetime.now(UTC)
        try:
            readings = _source(ctx).read(now)
            publishes = []
            for r in readings:
                sample = GpuSample(
                    node=r.node,
                    gpu_index=r.gpu_index,
                    gpu_uuid=r.gpu_uuid,
                    at=r.at,
                    utilization_pct=r.utilization_pct,
                    memory_used_mib=r.memory_used_mib,
                    power_w=r.power_w,
                    temperature_c=r.temperature_c,
                )
                subject, headers, body = encode(sample, f"tessera/telemetry/{r.node}", time=now)
                publishes.append(ctx.js.publish(subject, body, headers=headers))
            await asyncio.gather(*publishes)
        except Exception:
            log.exception("sample publication failed")
        await _sleep(ctx, interval)
