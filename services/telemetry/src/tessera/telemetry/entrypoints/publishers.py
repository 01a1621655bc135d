"""Background tasks: the inventory announcer and the sampler (samples, rollups, findings)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime, timedelta
from typing import Literal

from tessera.contracts.events import GpuSample, PodGpuShare, PodGpuUsage
from tessera.core.messaging.envelope import encode
from tessera.core.runner import ServiceContext
from tessera.core.waits import wait_any
from tessera.telemetry.adapters.processes import ProcessResolver
from tessera.telemetry.domain.attributed import AttributedGpu
from tessera.telemetry.domain.model import Reading, SourceUnavailable, with_health
from tessera.telemetry.domain.pod_usage import node_batches
from tessera.telemetry.entrypoints.gpu_metrics import gpu_metrics
from tessera.telemetry.entrypoints.logs import failure_log
from tessera.telemetry.entrypoints.metrics import usage_metrics
from tessera.telemetry.service_layer.dependencies import Telemetry
from tessera.telemetry.service_layer.handlers import sync_inventory
from tessera.telemetry.service_layer.monitoring import record_observation, restore_findings
from tessera.telemetry.service_layer.usage import (
    NodeInfo,
    flush_usage,
    restore_usage,
)

log = logging.getLogger(__name__)
failures = failure_log(log)
"""Failures that come back every round are logged once per interval, with the count left out."""


async def announce_inventory(t: Telemetry) -> None:
    ctx = t.ctx
    republish = timedelta(seconds=t.inventory_republish_s)
    await t.restored.wait()
    while not ctx.stop.is_set():
        t.inventory_due.clear()
        try:
            nodes = with_health(await t.source.inventory(), t.monitor.health.unhealthy())
            if t.ledger is not None:
                t.ledger.set_nodes(
                    {
                        n.name: NodeInfo(
                            n.gpus[0].model if n.gpus else "",
                            n.labels,
                            {g.uuid: g.memory_mib for g in n.gpus},
                        )
                        for n in nodes
                    }
                )
            async with t.uow() as uow:
                if await sync_inventory(uow, t.source.name, nodes, republish, datetime.now(UTC)):
                    log.info("inventory announced", extra={"source": t.source.name})
                await uow.commit()
        except Exception:
            failures.error("inventory", "inventory announcement failed", exc_info=True)
        await wait_any(ctx.stop, t.inventory_due, timeout=t.inventory_interval_s)


async def sample(t: Telemetry) -> None:
    """Read every GPU each interval: publish the samples, then store rollups and findings."""
    ctx = t.ctx
    await _restore(t)
    try:
        await _sample_until_stopped(ctx, t)
    finally:
        await _flush_usage(t, datetime.now(UTC), final=True)
        with contextlib.suppress(Exception):
            await t.source.close()
        if t.attributor is not None:
            with contextlib.suppress(Exception):
                await t.attributor.close()


async def _sample_until_stopped(ctx: ServiceContext, t: Telemetry) -> None:
    while not ctx.stop.is_set():
        now = datetime.now(UTC)
        try:
            readings = await t.source.read(now)
        except SourceUnavailable as exc:
            failures.warning(
                "read", "the GPUs cannot be read", extra={"source": t.source.name, "reason": str(exc)}
            )
            readings = []
        except Exception:
            failures.error("read", "reading the GPUs failed", extra={"source": t.source.name}, exc_info=True)
            readings = []
        if readings:
            gpu_metrics(ctx.metrics.registry).record(readings)
            await _publish_samples(ctx, readings, now)
            await _observe(t, readings, now)
            await _account(t, readings, now)
        await wait_any(ctx.stop, timeout=t.sample_interval_s)


async def _restore(t: Telemetry) -> None:
    while not t.ctx.stop.is_set():
        try:
            async with t.uow() as uow:
                count = await restore_findings(uow, t.monitor)
                rows = 0
                if t.ledger is not None:
                    rows = await restore_usage(uow, t.ledger, datetime.now(UTC), t.usage_nodes)
            log.info("open findings restored", extra={"findings": count, "usage_rows": rows})
            break
        except Exception:
            failures.error("restore", "restoring open findings failed; retrying", exc_info=True)
            await wait_any(t.ctx.stop, timeout=1.0)
    t.restored.set()


async def _publish_samples(ctx: ServiceContext, readings: list[Reading], now: datetime) -> None:
    """Samples go straight to JetStream, not through the outbox: they are many, short-lived, and a lost
    sample is replaced by the next one."""
    publishes = []
    for r in readings:
        if r.lost or not r.utilization_known:  # a sample without its utilisation would read as 0%
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
        failures.warning(
            "samples",
            "some samples were not published",
            extra={"failed": len(failed), "error": repr(failed[0])},
        )


def _split(split: str) -> Literal["sm", "memory", "requested"]:
    if split == "sm":
        return "sm"
    return "memory" if split == "memory" else "requested"


async def _publish_pod_usage(
    ctx: ServiceContext, gpus: list[AttributedGpu], now: datetime, interval_s: float
) -> None:
    """Each node's per-pod use of this round, as one `pod_gpu_usage` batch (for slicing's packing);
    straight to JetStream like the samples: the next round replaces a lost batch."""
    publishes = []
    for batch in node_batches(gpus):
        event = PodGpuUsage(
            node=batch.node,
            at=now,
            interval_s=interval_s,
            pods=[
                PodGpuShare(
                    namespace=u.namespace,
                    pod=u.pod,
                    gpu_uuid=u.gpu_uuid,
                    gpu_index=u.gpu_index,
                    utilization_pct=round(u.utilization_pct, 3),
                    allocated_milli=u.allocated_milli,
                    split=_split(u.split),
                    container=u.container,
                )
                for u in batch.pods
            ],
        )
        subject, headers, body = encode(event, f"tessera/telemetry/{batch.node}", time=now)
        publishes.append(ctx.js.publish(subject, body, headers=headers))
    results = await asyncio.gather(*publishes, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        failures.warning(
            "pod-usage",
            "some per-pod usage batches were not published",
            extra={"failed": len(failed), "error": repr(failed[0])},
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
        failures.error("rollups", "storing rollups and findings failed", exc_info=True)
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


_last_flush: dict[int, datetime] = {}


async def _account(t: Telemetry, readings: list[Reading], now: datetime) -> None:
    """Attribute the round's readings to containers and count them (usage, cost, rightsizing)."""
    ledger, attributor = t.ledger, t.attributor
    if ledger is None or attributor is None:
        return
    try:
        directory = ledger.directory
        attributed = await attributor.attribute(readings, directory.placed_milli, directory.placements)
    except Exception:
        failures.error("attribute", "attributing the readings failed", exc_info=True)
        return
    if attributed.problems != t.attribution_problems:
        if attributed.problems:
            log.warning(
                "PodResources unavailable: usage of these nodes is attributed to the GPU source's own "
                "holders (pids or pods), split equally",
                extra={"nodes": attributed.problems},
            )
        else:
            log.info("PodResources available on every node again")
        t.attribution_problems = dict(attributed.problems)
    for gpu in attributed.gpus:
        # a reading without its utilisation still counts its allocation and cost, not as 0% used
        ledger.count(gpu.reading, gpu.shares, now)
    await _publish_pod_usage(t.ctx, attributed.gpus, now, t.sample_interval_s)
    usage_metrics(t.ctx.metrics.registry).record(
        ledger.accountant.take_sums(), t.currency, ledger.accountant.stats, len(attributed.fallback_nodes)
    )
    resolver: ProcessResolver | None = getattr(t.source, "resolver", None)
    if resolver is not None:
        usage_metrics(t.ctx.metrics.registry).record_processes(resolver.unknown)
    last = _last_flush.setdefault(id(t), now)
    if (now - last).total_seconds() >= t.usage_flush_s:
        await _flush_usage(t, now)


async def _flush_usage(t: Telemetry, now: datetime, final: bool = False) -> None:
    """`flush_usage` every `usage_flush_s`; on failure the rows and findings are kept for the next."""
    ledger = t.ledger
    if ledger is None:
        return
    _last_flush[id(t)] = now
    try:
        await flush_usage(t.uow, ledger, now, final)
    except Exception:
        if not final:
            failures.error("usage", "storing usage failed; it is kept for the next flush", exc_info=True)
