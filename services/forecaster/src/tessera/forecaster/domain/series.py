"""Load series: what is forecast, on a regular grid of steps. Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

Aggregation = Literal["mean", "sum"]

#: the series telemetry feeds: busy GPU-equivalents of one GPU shape (the sum over its GPUs of each
#: GPU's mean utilisation in the step, over 100)
GPU_BUSY = "gpu_busy"


@dataclass(frozen=True)
class SeriesKey:
    """A metric and the labels that tell its series apart: `requests_per_s{route=/v1/chat}`."""

    metric: str
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, metric: str, labels: Mapping[str, str] | None = None) -> SeriesKey:
        return cls(metric, tuple(sorted((labels or {}).items())))

    def label(self, name: str) -> str | None:
        return dict(self.labels).get(name)

    def matches(self, metric: str, selector: Mapping[str, str]) -> bool:
        mine = dict(self.labels)
        return self.metric == metric and all(mine.get(k) == v for k, v in selector.items())

    def __str__(self) -> str:
        if not self.labels:
            return self.metric
        return self.metric + "{" + ",".join(f"{k}={v}" for k, v in self.labels) + "}"


def bucket(at: datetime, step_s: float) -> datetime:
    """The start of the step `at` falls in (steps count from the Unix epoch)."""
    ts = at.timestamp()
    return datetime.fromtimestamp(math.floor(ts / step_s) * step_s, tz=at.tzinfo)


@dataclass(frozen=True)
class Grid:
    """A series on its regular grid: `values[i]` is the step starting at `start + i * step_s`; None is a
    step with no observation."""

    start: datetime
    step_s: float
    values: tuple[float | None, ...]

    @classmethod
    def from_points(
        cls, points: Mapping[datetime, float], step_s: float, *, until: datetime | None = None
    ) -> Grid | None:
        """The grid from the first observed step to `until`'s step (or the last observed one)."""
        if not points:
            return None
        starts = sorted(points)
        first = starts[0]
        last = bucket(until, step_s) if until is not None else starts[-1]
        n = max(0, round((last - first).total_seconds() / step_s)) + 1
        values: list[float | None] = [None] * n
        for at, value in points.items():
            i = round((at - first).total_seconds() / step_s)
            if 0 <= i < n:
                values[i] = value
        return cls(first, step_s, tuple(values))

    @property
    def end(self) -> datetime:
        """The start of the newest step."""
        return self.start + timedelta(seconds=self.step_s * (len(self.values) - 1))

    def at(self, i: int) -> datetime:
        return self.start + timedelta(seconds=self.step_s * i)

    def tail(self, n: int) -> Grid:
        if n >= len(self.values):
            return self
        cut = len(self.values) - n
        return Grid(self.at(cut), self.step_s, self.values[cut:])

    def last_value(self) -> float | None:
        """The newest finite reading, if any."""
        for v in reversed(self.values):
            if v is not None and math.isfinite(v):
                return v
        return None


def fill_gaps(values: Sequence[float | None], max_gap: int) -> list[float] | None:
    """Linear interpolation over gaps of at most `max_gap` steps (NaN and inf count as gaps); None when a
    gap is longer, or the series starts or ends with one."""
    clean = [v if v is not None and math.isfinite(v) else None for v in values]
    if not clean or clean[0] is None or clean[-1] is None:
        return None
    out: list[float] = []
    i = 0
    while i < len(clean):
        v = clean[i]
        if v is not None:
            out.append(v)
            i += 1
            continue
        j = i
        while clean[j] is None:
            j += 1
        if j - i > max_gap:
            return None
        before, after = out[-1], clean[j]
        assert after is not None
        for k in range(1, j - i + 1):
            out.append(before + (after - before) * k / (j - i + 1))
        i = j
    return out
