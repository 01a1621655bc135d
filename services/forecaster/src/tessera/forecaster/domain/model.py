"""What the forecaster keeps per series. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tessera.forecaster.domain.forecast import Forecast
from tessera.forecaster.domain.series import Aggregation, SeriesKey


@dataclass(frozen=True)
class Series:
    id: int
    key: SeriesKey
    step_s: float
    aggregation: Aggregation = "mean"
    gpu_shape: str | None = None


@dataclass(frozen=True)
class LatestForecast:
    """A series' latest forecast (the last good one), the reason it is served reactively now if it is,
    and its newest reading."""

    series_id: int
    forecast: Forecast | None
    degraded: str | None
    last_value: float | None
    last_at: datetime | None
    computed_at: datetime


@dataclass(frozen=True)
class ChosenModel:
    series_id: int
    chosen: str | None
    scores: dict[str, dict[str, float | str | None]]
    horizon: int
    fit_seconds: float
    reason: str | None
    fitted_at: datetime
