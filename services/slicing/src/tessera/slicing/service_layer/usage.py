"""Telemetry's per-pod GPU use (`pod_gpu_usage`) folded into each pod's minutes, in Postgres, and read
back as the planner's usage history. The inbox, in the same transaction, keeps a redelivered batch
from being counted twice."""

from __future__ import annotations

from datetime import datetime

from tessera.contracts.events import PodGpuUsage
from tessera.core.messaging.consumer import PermanentError
from tessera.core.messaging.envelope import Envelope
from tessera.slicing.adapters.usage_repository import UsageReading, minute_of
from tessera.slicing.domain.usage_history import UsageHistory, UsageSettings
from tessera.slicing.service_layer.unit_of_work import SlicingUnitOfWork


async def on_pod_usage(envelope: Envelope, uow: SlicingUnitOfWork) -> None:
    batch = envelope.parse()
    if not isinstance(batch, PodGpuUsage):
        raise PermanentError(f"unexpected {envelope.type}")
    await uow.usage.add(
        [
            UsageReading(
                pod=f"{p.namespace}/{p.pod}",
                at=batch.at,
                node=batch.node,
                gpu_uuid=p.gpu_uuid,
                utilization_pct=p.utilization_pct,
                allocated_milli=p.allocated_milli,
                split=p.split,
            )
            for p in batch.pods
        ]
    )


async def load_history(uow: SlicingUnitOfWork, settings: UsageSettings, now: datetime) -> UsageHistory:
    """Every pod's minutes within the lookback window that ends now."""
    first = minute_of(now) - settings.lookback_minutes
    return UsageHistory.of(await uow.usage.since(first), settings)
