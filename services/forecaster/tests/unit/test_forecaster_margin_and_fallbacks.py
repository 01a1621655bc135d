"""The margin learnt from recent under-forecasts, and the fallback to the reactive value on degraded input."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from tessera.forecaster.domain.checks import Degraded, InputPolicy, prepare
from tessera.forecaster.domain.forecast import NO_WINDOW, Forecast, replicas, serve
from tessera.forecaster.domain.margin import MarginLearner, quantile
from tessera.forecaster.domain.selection import Fitted
from tessera.forecaster.service_layer.engine import EngineConfig, SeriesForecaster
from tessera.forecaster.service_layer.metric_names import MetricRef

from .candidates import Repeating

T0 = datetime(2026, 11, 25, 4, 0, tzinfo=UTC)


def test_quantile_interpolates_between_order_statistics() -> None:
    assert quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert quantile([1.0, 2.0, 3.0], 1.0) == 3.0
    assert quantile([1.0, 2.0, 3.0], 0.0) == 1.0


def test_the_margin_is_the_quantile_of_recent_shortfalls_and_never_negative() -> None:
    learner = MarginLearner(q=0.9, window=100, min_errors=10)
    for _ in range(9):
        learner.observe(10.0, 12.0)
    assert learner.margin() is None  # too few errors yet
    for i in range(91):
        learner.observe(10.0, 10.0 + (i % 10) * 0.5)  # shortfalls of 0 … 4.5
    margin = learner.margin()
    assert margin is not None and 4.0 <= margin <= 4.5
    over = MarginLearner(q=0.9, min_errors=1)
    for _ in range(20):
        over.observe(10.0, 5.0)  # always over-forecast: no margin needed
    assert over.margin() == 0.0


def test_the_margin_forgets_errors_older_than_its_window() -> None:
    learner = MarginLearner(q=1.0, window=20, min_errors=1)
    learner.extend([100.0] * 20)
    for _ in range(20):
        learner.observe(10.0, 11.0)
    assert learner.margin() == 1.0


def test_a_higher_quantile_serves_a_larger_margin() -> None:
    errors = [float(i) for i in range(50)]
    low, high = MarginLearner(q=0.5), MarginLearner(q=0.95)
    low.extend(errors)
    high.extend(errors)
    assert (low.margin() or 0) < (high.margin() or 0)


def test_the_served_value_is_the_window_maximum_plus_the_margin() -> None:
    forecast = Forecast(T0, 60.0, (1.0, 5.0, 2.0, 9.0, 1.0), "ets", margin=0.5)
    served = serve(forecast, now=T0 + timedelta(seconds=10), window_s=120, last_value=3.0)
    assert (served.value, served.expected, served.source, served.model) == (5.5, 5.0, "forecast", "ets")
    wider = serve(forecast, now=T0, window_s=240, last_value=3.0)
    assert wider.expected == 9.0  # a rise forecast within the window is provisioned now
    later = serve(forecast, now=T0 + timedelta(minutes=4), window_s=60, last_value=3.0)
    assert later.expected == 9.0  # the window moves with now


def test_a_window_of_zero_serves_the_last_reading_not_the_forecast() -> None:
    forecast = Forecast(T0, 60.0, (1.0, 5.0, 2.0, 9.0, 1.0), "ets", margin=0.5)
    served = serve(forecast, now=T0 + timedelta(seconds=10), window_s=0, last_value=3.0)
    assert (served.value, served.expected, served.source, served.reason) == (3.0, 3.0, "reactive", NO_WINDOW)
    assert serve(forecast, now=T0, window_s=1, last_value=3.0).source == "forecast"


@pytest.mark.parametrize(
    ("window", "expected"),
    [(None, 300.0), ("0", 0.0), ("-5", 0.0), ("4", 4.0), ("0.5", 0.5), ("nan", 300.0), ("soon", 300.0)],
)
def test_the_selector_window_is_the_prediction_window_and_zero_means_none(
    window: str | None, expected: float
) -> None:
    selector = {"app": "chat", **({"window": window} if window is not None else {})}
    ref = MetricRef.from_selector("requests_per_s", selector, 300.0)
    assert (ref.series_metric, ref.selector, ref.window_s) == ("requests_per_s", {"app": "chat"}, expected)


def test_a_forecast_that_no_longer_reaches_now_falls_back_to_the_last_reading() -> None:
    forecast = Forecast(T0, 60.0, (1.0, 2.0), "ets")
    served = serve(forecast, now=T0 + timedelta(minutes=10), window_s=60, last_value=3.0)
    assert (served.value, served.source, served.reason) == (3.0, "reactive", "stale")


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ([], Degraded.NO_DATA),
        ([None, None], Degraded.NO_DATA),
        ([1.0, 2.0, 3.0], Degraded.TOO_LITTLE_HISTORY),
        ([1.0 + i % 3 for i in range(100)] + [None] * 5, Degraded.STALE),
        ([1.0 + i % 3 if i % 3 else None for i in range(100)], Degraded.GAPS),
        ([1.0 + i % 3 for i in range(50)] + [None] * 10 + [1.0 + i % 3 for i in range(50)], Degraded.GAPS),
        ([math.nan if i % 2 else 1.0 + i % 3 for i in range(100)], Degraded.NOT_FINITE),
        ([1.0 + i % 3 for i in range(99)] + [-1.0], Degraded.NEGATIVE),
        ([4.0] * 100, Degraded.CONSTANT),
    ],
)
def test_degraded_input_says_why(values: list[float | None], reason: Degraded) -> None:
    assert prepare(values, InputPolicy(min_history=60)).degraded == reason


def test_short_gaps_and_a_late_newest_step_are_filled_and_forecast() -> None:
    values: list[float | None] = [1.0 + i % 3 for i in range(100)]
    values[50] = None
    values[51] = math.nan
    values.append(None)  # the newest step has not come yet: within the tolerance
    prepared = prepare(values, InputPolicy(min_history=60))
    assert prepared.degraded is None and len(prepared.values) == 100
    assert all(math.isfinite(v) for v in prepared.values)


class Broken:
    name = "broken"

    def min_history(self, horizon: int) -> int:
        return 1

    def fit(self, history: Sequence[float], horizon: int) -> Fitted:
        raise RuntimeError("no")


def _last_unless_diverged(history: Sequence[float]) -> float:
    if history[-1] > 1000:
        raise ValueError("diverged")
    return history[-1]


FLAT = Repeating("flat", _last_unless_diverged, history=1)


CONFIG = EngineConfig(horizon=4, window_steps=2, backtest_origins=3, backtest_stride=2, min_errors=1)
SERIES: list[float | None] = [1.0 + (i % 5) for i in range(80)]


def test_the_engine_serves_the_reactive_value_with_the_reason_when_no_model_fits() -> None:
    engine = SeriesForecaster(CONFIG, lambda: [Broken()])
    update = engine.step(SERIES, T0, 60.0)
    assert (update.forecast, update.degraded, update.last_value) == (None, Degraded.FIT_FAILED, SERIES[-1])
    assert update.selection is not None and update.selection.chosen is None
    served = serve(
        update.forecast, now=T0, window_s=60, last_value=update.last_value, degraded=update.degraded
    )
    assert (served.value, served.source, served.reason) == (SERIES[-1], "reactive", "fit_failed")


def test_the_engine_recovers_after_a_failed_prediction_and_keeps_going_on_degraded_input() -> None:
    engine = SeriesForecaster(CONFIG, lambda: [FLAT])
    first = engine.step(SERIES, T0, 60.0)
    assert first.forecast is not None and first.forecast.model == "flat"
    failed = engine.step([*SERIES, 5000.0], T0 + timedelta(minutes=1), 60.0)
    assert failed.degraded == Degraded.FIT_FAILED and failed.last_value == 5000.0
    again = engine.step([*SERIES, 3.0, 4.0], T0 + timedelta(minutes=2), 60.0)
    assert again.forecast is not None and again.selection is not None  # refit after the failure
    constant = engine.step([2.0] * 80, T0 + timedelta(minutes=3), 60.0)
    assert constant.degraded == Degraded.CONSTANT and constant.last_value == 2.0


def test_the_engine_judges_a_forecast_once_its_window_has_passed_and_learns_the_margin() -> None:
    engine = SeriesForecaster(CONFIG, lambda: [FLAT])
    values = list(SERIES)
    engine.step(values, T0, 60.0)  # forecasts SERIES[-1] (= 5.0) for the next 2 steps
    values.append(7.0)
    assert engine.step(values, T0 + timedelta(minutes=1), 60.0).judged == ()
    values.append(6.5)
    judged = engine.step(values, T0 + timedelta(minutes=2), 60.0).judged
    assert judged[0] == (T0, "flat", 5.0, 6.5)  # against the load at the window's end
    assert engine.learner.margin() == 1.5


def test_replicas_round_up_within_bounds() -> None:
    assert replicas(4.1, 2.0, 1, 10) == 3
    assert replicas(0.0, 2.0, 1, 10) == 1
    assert replicas(100.0, 2.0, 1, 10) == 10
