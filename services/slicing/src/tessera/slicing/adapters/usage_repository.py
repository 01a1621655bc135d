"""Each pod's measured GPU use per minute in Postgres (`slicing.pod_usage`): readings are summed into
their minute's row as they come, and the planner reads the window back. Rows older than the window
are removed by the service's retention rule."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.slicing.adapters.orm import pod_usage
from tessera.slicing.domain.usage_history import MinuteUse

MINUTE_S = 60


def minute_of(at: datetime) -> int:
    """Whole minutes since the epoch."""
    return int(at.timestamp() // MINUTE_S)


def minute_start(minute: int) -> datetime:
    return datetime.fromtimestamp(minute * MINUTE_S, UTC)


@dataclass(frozen=True, slots=True)
class UsageReading:
    """One pod's use of one GPU in one sampling round."""

    pod: str  # namespace/name
    at: datetime
    node: str
    gpu_uuid: str
    utilization_pct: float
    allocated_milli: int
    split: str


class UsageRepository(Protocol):
    async def add(self, readings: Sequence[UsageReading]) -> None:
        """Add each reading to its pod's row for the reading's minute."""
        ...

    async def since(self, minute: int) -> list[MinuteUse]:
        """Every pod's minutes from `minute` on."""
        ...


class SqlUsageRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def add(self, readings: Sequence[UsageReading]) -> None:
        # one row per (pod, minute): a pod on two GPUs in one round sums them, as its use of GPUs
        totals: dict[tuple[str, int], float] = {}
        latest: dict[tuple[str, int], UsageReading] = {}
        for r in readings:
            key = (r.pod, minute_of(r.at))
            totals[key] = totals.get(key, 0.0) + r.utilization_pct
            latest[key] = r
        rows = [
            {
                "pod": pod,
                "minute": minute_start(minute),
                "node": r.node,
                "gpu_uuid": r.gpu_uuid,
                "total_pct": totals[(pod, minute)],
                "samples": 1,
                "allocated_milli": r.allocated_milli,
                "split": r.split,
            }
            for (pod, minute), r in latest.items()
        ]
        if not rows:
            return
        statement = pg_insert(pod_usage).values(rows)
        excluded = statement.excluded
        await self.session.execute(
            statement.on_conflict_do_update(
                index_elements=[pod_usage.c.pod, pod_usage.c.minute],
                set_={
                    "total_pct": pod_usage.c.total_pct + excluded.total_pct,
                    "samples": pod_usage.c.samples + excluded.samples,
                    "node": excluded.node,
                    "gpu_uuid": excluded.gpu_uuid,
                    "allocated_milli": excluded.allocated_milli,
                    "split": excluded.split,
                },
            )
        )

    async def since(self, minute: int) -> list[MinuteUse]:
        rows = await self.session.execute(
            select(pod_usage.c.pod, pod_usage.c.minute, pod_usage.c.total_pct, pod_usage.c.samples).where(
                pod_usage.c.minute >= minute_start(minute)
            )
        )
        return [MinuteUse(row.pod, minute_of(row.minute), row.total_pct, row.samples) for row in rows]
