"""Retention: rows that have served their purpose are deleted by a periodic task of the runner.

Every service keeps its inbox only as long as a redelivery or a republish could still arrive (longer
than the stream's duplicate window); services add their own rules (raw samples, observed events),
while rollups are kept longer by rules of their own."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Table, delete
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class RetentionRule:
    """Delete rows of `table` whose timestamp `column` is older than `max_age_s`."""

    table: Table
    column: str
    max_age_s: float

    def __post_init__(self) -> None:
        if self.column not in self.table.c:
            raise ValueError(f"{self.table.fullname} has no column {self.column!r}")
        if self.max_age_s <= 0:
            raise ValueError(f"max_age_s must be positive, got {self.max_age_s}")

    @property
    def name(self) -> str:
        return self.table.fullname


async def purge(
    sessions: async_sessionmaker[AsyncSession], rules: Sequence[RetentionRule], now: datetime
) -> dict[str, int]:
    """Apply every rule once at time `now`; returns the rows deleted per table."""
    deleted: dict[str, int] = {}
    async with sessions() as session, session.begin():
        for rule in rules:
            cutoff = now - timedelta(seconds=rule.max_age_s)
            result = await session.execute(delete(rule.table).where(rule.table.c[rule.column] < cutoff))
            deleted[rule.name] = deleted.get(rule.name, 0) + int(getattr(result, "rowcount", 0) or 0)
    return deleted
