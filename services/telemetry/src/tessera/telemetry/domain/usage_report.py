"""Usage read back: rollup rows summed per tenant, queue, job or flavor, the most expensive first. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from tessera.telemetry.domain.usage_rows import HOUR_S, UsageRow


class GroupBy(StrEnum):
    TENANT = "tenant"
    QUEUE = "queue"
    JOB = "job"
    FLAVOR = "flavor"


@dataclass(frozen=True)
class UsageTotal:
    """Usage of one tenant, queue, job or flavor over a period."""

    group: str
    allocated_gpu_hours: float
    used_gpu_hours: float
    idle_gpu_hours: float
    memory_gib_hours: float
    cost: float
    tenant: str = ""
    queue: str = ""

    @property
    def utilisation_pct(self) -> float:
        return 100.0 * self.used_gpu_hours / self.allocated_gpu_hours if self.allocated_gpu_hours else 0.0

    @property
    def waste_gpu_hours(self) -> float:
        """Allocated but unused GPU-hours."""
        return max(0.0, self.allocated_gpu_hours - self.used_gpu_hours)


def group_key(row: UsageRow, by: GroupBy) -> str:
    if by is GroupBy.TENANT:
        return row.tenant
    if by is GroupBy.QUEUE:
        return row.queue
    if by is GroupBy.FLAVOR:
        return row.flavor
    return row.job_id


def totals(rows: Iterable[UsageRow], by: GroupBy) -> list[UsageTotal]:
    """Rows summed per group, the most expensive first."""
    sums: dict[str, list[float]] = {}
    labels: dict[str, tuple[str, str]] = {}
    for r in rows:
        g = group_key(r, by)
        acc = sums.setdefault(g, [0.0, 0.0, 0.0, 0.0, 0.0])
        acc[0] += r.allocated_gpu_s
        acc[1] += r.used_gpu_s
        acc[2] += r.idle_gpu_s
        acc[3] += r.memory_mib_s
        acc[4] += r.cost
        labels.setdefault(g, (r.tenant, r.queue))
    out = [
        UsageTotal(
            g,
            a / HOUR_S,
            u / HOUR_S,
            i / HOUR_S,
            m / 1024 / HOUR_S,
            c,
            labels[g][0] if by in (GroupBy.JOB, GroupBy.QUEUE) else "",
            labels[g][1] if by is GroupBy.JOB else "",
        )
        for g, (a, u, i, m, c) in sums.items()
    ]
    return sorted(out, key=lambda t: (-t.cost, -t.allocated_gpu_hours, t.group))
