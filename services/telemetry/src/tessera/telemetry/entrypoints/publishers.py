"""Background tasks: the inventory announcer and the sampler (samples, rollups, findings)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime, timedelta

from tessera.contracts.events import GpuSample
from tessera.core.messaging.envelope import encode
from tessera.core.runner import ServiceContext
from tessera.core.waits import wait_any
from tessera.telemetry.domain.model import Reading, SourceUnavailable, with_health
from tessera.telemetry.service_layer.dependencies import Telemetry
from tessera.telemetry.service_layer.handlers import sync_inventory
from tessera.telemetry.service_layer.monitoring import record_observation, restore_findings

log = logging.getLogger(__name__)


async def announce_inventory(t: Telemetry) -> None:
    ctx = t.ctx
    republish = timedelta(seconds=t.inventory_republish_s)
    await t.restored.wait()
    while not ctx.stop.is_set():
        t.inventory_due.clear()
        try:
            nodes = with_health(await t.source.inventory(), t.monitor.health.unhealthy())
            async with t.uow() as uow:
                if await sync_inventory(uow, t.source.name, nodes, republish, datetime.now(UTC)):
                    log.info("inventory announced", extra={"source": t.source.name})
                await uow.commit()
        except Exception:
            log.exception("inventory announcement failed")
        await wait_any(ctx.stop, t.inventory_due, timeout=t.inventory_interval_s)


async def sample(t: Telemetry) -> None:
    """Read every GPU each interval: publish the samples, then store rollups and findings."""
    ctx = t.ctx
    await _restore(t)
    try:
        await _sample_until_stopped(ctx, t)
    finally:
        with contextlib.suppress(Exception):
            await t.source.close()


async def _sample_until_stopped(ctx: ServiceContext, t: Telemetry) -> None:
    while not ctx.stop.is_set():
        now = datetime.now(UTC)
        try:
            readings = await t.source.read(now)
        except SourceUnavailable as exc:
            log.warning("the GPUs cannot be read", extra={"source": t.source.name, "reason": str(exc)})
            readings = []
        except Exception:
            log.exception("reading the GPUs failed", extra={"source": t.source.name})
            readings = []
        if readings:
            await _publish_samples(ctx, readings, now)
            await _observe(t, readings, now)
        await wait_any(ctx.stop, timeout=t.sample_interval_s)


async def _restore(t: Telemetry) -> None:
    while not t.ctx.stop.is_set():
        try:
            async with t.uow() as uow:
                count = await restore_findings(uow, t.monitor)
            log.info("open findings restored", extra={"findings": count})
            break
        except Exception:
            log.exception("restoring open findings failed; retrying")
            await wait_any(t.ctx.stop, timeout=1.0)
    t.restored.set()


async def _publish_samples(ctx: ServiceContext, readings: list[Reading], now: datetime) -> None:
    """Samples go straight to JetStream, not through the outbox: they are many, short-lived, and a lost
    sample is replaced by the next one."""
    publishes = []
    for r in readings:
        if r.lost:
            continue
        sample_event = GpuSample(
            node=r.node,
            gpu_index=r.gpu_index,
            gpu_uuid=r.gpu_uuid,
            at=r.at,
            utilization_pct=min(100.0, max(0.0, r.utilization_pct)),
            memory_used_mib=max(0, r.memory_used_mib),
            power_w=max(0.0, r.power_w),
            temperature_c=r.temperature_c,
        )
        subject, headers, body = encode(sample_event, f"tessera/telemetry/{r.node}", time=now)
        publishes.append(ctx.js.publish(subject, body, headers=headers))
    results = await asyncio.gather(*publishes, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        log.warning(
            "some samples were not published", extra={"failed": len(failed), "error": repr(failed[0])}
        )


async def _observe(t: Telemetry, readings: list[Reading], now: datetime) -> None:
    before = t.monitor.checkpoint()
    observation = t.monitor.observe(readings, now)
    try:
        async with t.uow() as uow:
            await record_observation(uow, observation)
            await uow.commit()
    except Exception:
        # nothing was stored: forget this batch, so its findings come again with the next readings
        t.monitor = before
        log.exception("storing rollups and findings failed")
        return
    for change in observation.health:
        log.warning(
            "gpu health changed",
            extra={
                "gpu": change.reading.gpu_uuid,
                "node": change.reading.node,
                "change": type(change).__name__,
            },
        )
    if observation.health_changed:
        t.inventory_due.set()
