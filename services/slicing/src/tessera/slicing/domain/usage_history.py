"""Each pod's measured GPU use, minute by minute, over a bounded window. Pure.

Telemetry sends every pod's attributed use once per sampling round (`pod_gpu_usage`); the service
folds the readings into minutes (their mean) and keeps the last `lookback_minutes`. The planner asks
for a pod's series aligned on the same minutes as every other pod's, the way B5 packs the GenAI pods
(bench/_slicing_cost.py, with the same defaults): minutes the pod has no reading for (before it
started, or readings lost) count as its own peak so far, once it has `min_history_minutes` minutes
of readings. A pod with fewer has no history, and the planner sizes it by its requested milli.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class UsageSettings:
    """How much history counts and how (B5's cost view defaults)."""

    lookback_minutes: int = 360
    half_life_minutes: float | None = 30.0
    overload_budget: float = 0.008
    min_history_minutes: int = 10

    def __post_init__(self) -> None:
        if self.lookback_minutes < 1:
            raise ValueError(f"lookback_minutes: must be >= 1, got {self.lookback_minutes}")
        if self.half_life_minutes is not None and self.half_life_minutes <= 0:
            raise ValueError(f"half_life_minutes: must be > 0, got {self.half_life_minutes}")
        if not 0 <= self.overload_budget < 1:
            raise ValueError(f"overload_budget: must be within [0, 1), got {self.overload_budget}")
        if not 1 <= self.min_history_minutes <= self.lookback_minutes:
            raise ValueError(
                f"min_history_minutes: must be within 1..lookback_minutes ({self.lookback_minutes}), "
                f"got {self.min_history_minutes}"
            )


@dataclass(frozen=True, slots=True)
class MinuteUse:
    """A pod's readings within one minute (minute = whole minutes since the epoch)."""

    pod: str  # namespace/name
    minute: int
    total_pct: float
    samples: int

    @property
    def mean_pct(self) -> float:
        return self.total_pct / self.samples if self.samples else 0.0


@dataclass
class UsageHistory:
    """Per pod, its mean use per minute (percent of a GPU), the last `lookback_minutes` only."""

    settings: UsageSettings = field(default_factory=UsageSettings)
    _minutes: dict[str, dict[int, tuple[float, int]]] = field(default_factory=dict)

    @classmethod
    def of(cls, rows: Iterable[MinuteUse], settings: UsageSettings | None = None) -> UsageHistory:
        history = cls(settings or UsageSettings())
        for row in rows:
            history.add(row.pod, row.minute, row.total_pct, row.samples)
        return history

    def add(self, pod: str, minute: int, total_pct: float, samples: int = 1) -> None:
        """Readings of `pod` within `minute` (summed percent over `samples` readings)."""
        if samples < 1:
            raise ValueError(f"samples: must be >= 1, got {samples}")
        minutes = self._minutes.setdefault(pod, {})
        total, count = minutes.get(minute, (0.0, 0))
        minutes[minute] = (total + max(0.0, total_pct), count + samples)

    def prune(self, now_minute: int) -> None:
        """Forget minutes older than the window that ends at `now_minute`."""
        oldest = now_minute - self.settings.lookback_minutes
        for pod in list(self._minutes):
            kept = {m: v for m, v in self._minutes[pod].items() if m >= oldest}
            if kept:
                self._minutes[pod] = kept
            else:
                del self._minutes[pod]

    @property
    def pods(self) -> list[str]:
        return sorted(self._minutes)

    def minutes_of(self, pod: str) -> int:
        return len(self._minutes.get(pod, {}))

    def series(self, pod: str, now_minute: int) -> tuple[float, ...] | None:
        """The pod's use over the `lookback_minutes` before `now_minute`, oldest first; None when it
        has fewer than `min_history_minutes` minutes of readings in that window."""
        lookback = self.settings.lookback_minutes
        first = now_minute - lookback
        seen = {m: v for m, v in self._minutes.get(pod, {}).items() if first <= m < now_minute}
        if len(seen) < self.settings.min_history_minutes:
            return None
        means = {m: min(100.0, total / count) for m, (total, count) in seen.items()}
        peak = max(means.values())
        return tuple(means.get(first + i, peak) for i in range(lookback))
