"""What usage accounting counts: the hourly rows and their keys, the policy and the counters. Pure.

A row (`UsageRow`) is one container's use of one GPU over one hour (`UsageKey`), with what it is
billed to and its totals: allocated, used and idle GPU-seconds, memory MiB-seconds, cost, and the
readings it counted. `domain.usage`'s `Accountant` adds readings to them; see it for the rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple

HOUR_S = 3600


class UsageKey(NamedTuple):
    """An hourly row's key. (A named tuple: hashed in C, for the lookups every flush makes.)"""

    window_start: datetime
    node: str
    gpu_uuid: str
    namespace: str
    pod: str
    container: str


@dataclass(slots=True)
class UsageRow:
    """One container's use of one GPU over one hour, with what it is billed to."""

    key: UsageKey
    job_id: str
    queue: str
    tenant: str
    flavor: str
    capacity_type: str
    split: str
    allocated_gpu_s: float = 0.0
    used_gpu_s: float = 0.0
    memory_mib_s: float = 0.0
    idle_gpu_s: float = 0.0
    cost: float = 0.0
    samples: int = 0
    first_at: datetime | None = None
    last_at: datetime | None = None
    #: the start (epoch seconds) of the container's idle run in progress at `last_at` (None: it was
    #: not idle), and the idle seconds of this row in that run not yet counted (the run is shorter
    #: than the window): what a restart continues the run from
    idle_run_since: float | None = None
    idle_pending_s: float = 0.0

    @property
    def allocated_gpu_hours(self) -> float:
        return self.allocated_gpu_s / HOUR_S

    @property
    def used_gpu_hours(self) -> float:
        return self.used_gpu_s / HOUR_S

    @property
    def idle_gpu_hours(self) -> float:
        return self.idle_gpu_s / HOUR_S


@dataclass(frozen=True)
class AccountingPolicy:
    interval_s: float = 10.0
    #: a gap between readings longer than this counts as this much (telemetry was down)
    max_gap_s: float = 30.0
    idle_below_pct: float = 5.0
    idle_window_s: float = 600.0
    #: a reading this far from the accountant's clock is clamped to it
    max_skew_s: float = 30.0
    #: an hour closes (is written for the last time) this long after the idle window that could reach
    #: back into it has passed (`hold_s`)
    close_after_s: float = 120.0

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.max_gap_s < self.interval_s:
            raise ValueError("interval_s must be positive and max_gap_s at least interval_s")

    @property
    def hold_s(self) -> float:
        """How long after its end an hour stays open: an idle run that began in it is flagged up to
        `idle_window_s` later, and its idle seconds then go to that hour's row, so the row must still
        be held; then `close_after_s` for late readings."""
        return self.idle_window_s + self.close_after_s


@dataclass
class AccountingStats:
    samples: int = 0
    shares: int = 0
    duplicates: int = 0
    late: int = 0
    unknown_pod_shares: int = 0
    clamped: int = 0
    #: node -> the largest clock skew seen (seconds, reading minus accountant clock)
    worst_skew_s: dict[str, float] = field(default_factory=dict)


def hour_of(at: datetime) -> datetime:
    epoch = at.timestamp()
    return datetime.fromtimestamp(epoch - epoch % HOUR_S, UTC)
