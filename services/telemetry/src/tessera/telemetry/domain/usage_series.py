"""Usage over time: per group and hour, the mean GPUs allocated, used and idle (GPU-seconds in the
hour / 3600), for the groups that were allocated the most GPU-hours, the rest summed as `other`. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from tessera.telemetry.domain.usage_report import GroupBy, group_key
from tessera.telemetry.domain.usage_rows import HOUR_S, UsageRow

OTHER = "other"
#: the longest series answered: 93 days of hours
MAX_HOURS = 93 * 24


@dataclass(frozen=True)
class HourSum:
    """One group's sums over one hour of the hourly rows."""

    hour: datetime
    group: str
    allocated_gpu_s: float
    used_gpu_s: float
    idle_gpu_s: float
    cost: float


@dataclass(frozen=True)
class Point:
    hour: datetime
    allocated_gpus: float
    used_gpus: float
    idle_gpus: float


@dataclass(frozen=True)
class Series:
    group: str
    allocated_gpu_hours: float
    used_gpu_hours: float
    cost: float
    points: tuple[Point, ...]


def hour_floor(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


def hours(start: datetime, end: datetime) -> list[datetime]:
    """The hours that start in [hour_floor(start), end)."""
    out: list[datetime] = []
    at = hour_floor(start)
    while at < end:
        out.append(at)
        at += timedelta(hours=1)
    return out


def hour_sums(rows: Iterable[UsageRow], by: GroupBy) -> list[HourSum]:
    """What the repository's one query answers, from rows in memory (a replay, a bench)."""
    sums: dict[tuple[datetime, str], list[float]] = {}
    for r in rows:
        acc = sums.setdefault((r.key.window_start, group_key(r, by)), [0.0, 0.0, 0.0, 0.0])
        acc[0] += r.allocated_gpu_s
        acc[1] += r.used_gpu_s
        acc[2] += r.idle_gpu_s
        acc[3] += r.cost
    return [HourSum(h, g, *v) for (h, g), v in sorted(sums.items())]


def shape_series(sums: Iterable[HourSum], start: datetime, end: datetime, top: int) -> list[Series]:
    """One series per group of the `top` by allocated GPU-hours (ties by name), the rest as `other`,
    each with a point for every hour from `start` to `end` (zeros where nothing was held)."""
    if top < 1:
        raise ValueError(f"top: at least 1, got {top}")
    items = list(sums)
    allocated: dict[str, float] = {}
    for s in items:
        allocated[s.group] = allocated.get(s.group, 0.0) + s.allocated_gpu_s
    ranked = sorted(allocated, key=lambda g: (-allocated[g], g))
    kept = set(ranked[:top])
    order = ranked[:top] + ([OTHER] if len(ranked) > top else [])
    grid = hours(start, end)
    cells: dict[str, dict[datetime, list[float]]] = {g: {} for g in order}
    for s in items:
        group = s.group if s.group in kept else OTHER
        acc = cells[group].setdefault(s.hour, [0.0, 0.0, 0.0, 0.0])
        acc[0] += s.allocated_gpu_s
        acc[1] += s.used_gpu_s
        acc[2] += s.idle_gpu_s
        acc[3] += s.cost
    out: list[Series] = []
    for group in order:
        by_hour = cells[group]
        zero = [0.0, 0.0, 0.0, 0.0]
        points = tuple(Point(h, *(v / HOUR_S for v in by_hour.get(h, zero)[:3])) for h in grid)
        totals = [sum(v[i] for v in by_hour.values()) for i in range(4)]
        out.append(Series(group, totals[0] / HOUR_S, totals[1] / HOUR_S, totals[3], points))
    return out
