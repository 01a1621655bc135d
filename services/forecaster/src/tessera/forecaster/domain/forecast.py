"""Forecasts and the value served from them. Pure.

The served value is the largest forecast over `[now, now + window]` plus the learned margin: a load
forecast to rise within the window is provisioned now, and scaling down waits until the whole window
is forecast low (the way Crane's EHPA defers scale-down). A window of 0 asks for no forecast: the last
reading is served, as a plain HPA on the same metric reads it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from tessera.forecaster.domain.checks import Degraded

Source = Literal["forecast", "reactive"]
#: the reason given when a window of 0 asked for the last reading rather than a forecast
NO_WINDOW = "no_window"


@dataclass(frozen=True)
class Forecast:
    """Forecasts of the steps after `origin` (the newest observed step): `values[h - 1]` is horizon h."""

    origin: datetime
    step_s: float
    values: tuple[float, ...]
    model: str
    margin: float = 0.0
    """the learned margin when it was made, in the series' unit"""
    level: float = 0.0
    """the series' mean over the last hour it saw"""
    last_value: float = 0.0
    """the newest reading it saw (the reactive value)"""

    def horizon_at(self, now: datetime) -> int:
        """How many steps past the origin `now` lies (at least 0)."""
        return max(0, math.floor((now - self.origin).total_seconds() / self.step_s))

    def window_max(self, now: datetime, window_s: float) -> float | None:
        """The largest forecast over `[now, now + window_s]`; None when the forecast no longer reaches now."""
        first = max(1, self.horizon_at(now))
        last = max(first, self.horizon_at(now + timedelta(seconds=window_s)))
        if first > len(self.values):
            return None
        return max(self.values[first - 1 : min(last, len(self.values))])

    def ends(self) -> datetime:
        return self.origin + timedelta(seconds=self.step_s * len(self.values))


@dataclass(frozen=True)
class Served:
    """What an autoscaler gets for one series, and why."""

    value: float
    expected: float
    source: Source
    reason: str | None = None
    model: str | None = None
    origin: datetime | None = None


def serve(
    forecast: Forecast | None,
    *,
    now: datetime,
    window_s: float,
    last_value: float | None,
    degraded: Degraded | str | None = None,
) -> Served:
    """The served value: the forecast's window maximum plus its margin, or the last reading (reactive)
    with the reason when there is no usable forecast or a window of 0 asks for none. Never negative; 0
    with neither."""
    if window_s <= 0:
        degraded = NO_WINDOW
    if degraded is None and forecast is not None:
        expected = forecast.window_max(now, window_s)
        if expected is not None:
            expected = max(0.0, expected)
            margin = max(0.0, forecast.margin)
            return Served(expected + margin, expected, "forecast", None, forecast.model, forecast.origin)
        degraded = Degraded.STALE
    reason = str(degraded) if degraded is not None else str(Degraded.NO_FORECAST)
    value = max(0.0, last_value) if last_value is not None and math.isfinite(last_value) else 0.0
    return Served(value, value, "reactive", reason, forecast.model if forecast else None, None)


def replicas(value: float, target: float, min_replicas: int, max_replicas: int) -> int:
    """Replicas that keep `value` per replica at or below `target`, within the bounds."""
    if target <= 0:
        raise ValueError("target must be positive")
    wanted = math.ceil(value / target - 1e-9) if value > 0 else 0
    return max(min_replicas, min(max_replicas, wanted))
