"""The candidate models, on darts (its core distribution: no torch): seasonal naive, exponential smoothing
(AutoETS), Theta, AutoARIMA and a lagged linear regression; with them the level smoothed for the lead,
with and without CUSUM resets (`domain.level`, `domain.level_cusum`, plain Python). Each implements the domain's `Candidate`."""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tessera.forecaster.domain.level import LevelSmoothing
from tessera.forecaster.domain.level_cusum import LevelCusum
from tessera.forecaster.domain.selection import Candidate, Fitted


def _quiet() -> None:
    for name in ("darts", "statsforecast", "cmdstanpy", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _silenced(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Convergence and deprecation warnings of the model libraries, on every fit, say nothing we act on."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args, **kwargs)

    return wrapper


def _series(values: Sequence[float]) -> Any:
    from darts import TimeSeries  # type: ignore[import-untyped]

    return TimeSeries.from_values(np.asarray(values, dtype=np.float64))


def _values(forecast: Any, horizon: int) -> list[float]:
    out = forecast.values(copy=False).reshape(-1)[:horizon]
    return [float(v) for v in out]


@dataclass
class _Refitting:
    """A cheap local model: refit on the newest history at every prediction."""

    make: Callable[[], Any]
    train_steps: int

    @_silenced
    def predict(self, history: Sequence[float], horizon: int) -> list[float]:
        model = self.make()
        model.fit(_series(history[-self.train_steps :]))
        return _values(model.predict(horizon), horizon)


@dataclass
class _Applied:
    """A fitted model applied to newer history without refitting (darts' transferable local models and
    global regression models take `series=`)."""

    model: Any
    context: int

    @_silenced
    def predict(self, history: Sequence[float], horizon: int) -> list[float]:
        return _values(self.model.predict(horizon, series=_series(history[-self.context :])), horizon)


@dataclass
class SeasonalNaive:
    """The value one season ago (K = 1: the last value)."""

    season: int = 1

    @property
    def name(self) -> str:
        return "naive" if self.season == 1 else f"seasonal_naive_{self.season}"

    def min_history(self, horizon: int) -> int:
        return max(2, self.season + 1)

    @_silenced
    def fit(self, history: Sequence[float], horizon: int) -> Fitted:
        from darts.models import NaiveSeasonal  # type: ignore[import-untyped]

        season = self.season
        return _Refitting(lambda: NaiveSeasonal(K=season), self.season + 2)


@dataclass
class ThetaModel:
    name: str = "theta"
    train_steps: int = 360

    def min_history(self, horizon: int) -> int:
        return 10

    @_silenced
    def fit(self, history: Sequence[float], horizon: int) -> Fitted:
        from darts.models import Theta  # type: ignore[import-untyped]
        from darts.utils.utils import SeasonalityMode  # type: ignore[import-untyped]

        return _Refitting(lambda: Theta(theta=2, season_mode=SeasonalityMode.NONE), self.train_steps)


@dataclass
class ExponentialSmoothing:
    """AutoETS (statsforecast): error, trend and damping chosen by AICc; no seasonality within a day."""

    name: str = "ets"
    context: int = 360

    def min_history(self, horizon: int) -> int:
        return 20

    @_silenced
    def fit(self, history: Sequence[float], horizon: int) -> Fitted:
        from darts.models import AutoETS  # type: ignore[import-untyped]

        _quiet()
        model = AutoETS(season_length=1, model="ZZN")
        model.fit(_series(history))
        return _Applied(model, self.context)


@dataclass
class Arima:
    """AutoARIMA (statsforecast), a stepwise search kept small so a day of minutes fits in well under a
    second; the fitted orders are then applied to newer data."""

    name: str = "arima"
    context: int = 360

    def min_history(self, horizon: int) -> int:
        return 30

    @_silenced
    def fit(self, history: Sequence[float], horizon: int) -> Fitted:
        from darts.models import AutoARIMA  # type: ignore[import-untyped]

        _quiet()
        model = AutoARIMA(
            season_length=1,
            seasonal=False,
            max_p=2,
            max_q=2,
            max_d=1,
            stepwise=True,
            approximation=True,
            nmodels=6,
        )
        model.fit(_series(history))
        return _Applied(model, self.context)


@dataclass
class LaggedRegression:
    """A linear regression of the next `horizon` steps on the last `lags` values (one model per horizon)."""

    lags: int = 30
    name: str = "linear"

    def min_history(self, horizon: int) -> int:
        return self.lags + horizon + 30

    @_silenced
    def fit(self, history: Sequence[float], horizon: int) -> Fitted:
        from darts.models import LinearRegressionModel  # type: ignore[import-untyped]

        _quiet()
        model = LinearRegressionModel(lags=self.lags, output_chunk_length=horizon)
        model.fit(_series(history))
        return _Applied(model, self.lags)


def default_candidates(season_steps: int | None = None, lead: int = 6) -> list[Candidate]:
    """The candidates every series is backtested with; a seasonal naive joins once a season is known.
    `lead` is the window the forecast is acted on over (the level models are fit for it)."""
    candidates: list[Candidate] = [
        LevelCusum(lead),
        LevelSmoothing(lead),
        SeasonalNaive(1),
        ThetaModel(),
        ExponentialSmoothing(),
        Arima(),
        LaggedRegression(),
    ]
    if season_steps and season_steps > 1:
        candidates.insert(1, SeasonalNaive(season_steps))
    return candidates
