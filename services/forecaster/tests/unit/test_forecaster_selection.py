"""The backtest chooses the model that forecasts a series best, on synthetic series whose best model is known."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.forecaster.adapters.models import LaggedRegression, SeasonalNaive, default_candidates
from tessera.forecaster.domain.selection import MEAN, BacktestPlan, Fitted, MeanOf, backtest


@dataclass
class Offset:
    """Forecasts the true continuation of a known series, off by `error`; or fails."""

    name: str
    truth: Sequence[float]
    error: float
    fails: bool = False

    def min_history(self, horizon: int) -> int:
        return 5

    def fit(self, history: Sequence[float], horizon: int) -> Fitted:
        if self.fails:
            raise RuntimeError("cannot fit")
        truth, error = self.truth, self.error

        class _F:
            def predict(self, history: Sequence[float], horizon: int) -> list[float]:
                n = len(history)
                return [truth[n + h] + error for h in range(horizon)]

        return _F()


SERIES = [10.0 + math.sin(i / 5) for i in range(400)]
PLAN = BacktestPlan(horizon=6, origins=5, stride=4, train_steps=1000)


def test_the_candidate_with_the_smallest_error_is_chosen_and_every_one_is_scored() -> None:
    candidates = [Offset("far", SERIES, 2.0), Offset("near", SERIES, 0.1), Offset("middle", SERIES, -0.5)]
    selection = backtest(SERIES, candidates, PLAN)
    assert selection.chosen == "near"
    near = selection.score("near")
    assert near is not None and math.isclose(near.mae, 0.1)
    assert [s.name for s in selection.scores] == ["far", "near", "middle"]
    middle = selection.score("middle")
    assert middle is not None and middle.under_share == 0.0  # an over-forecast is never short


def test_a_failing_or_too_hungry_candidate_is_scored_with_its_reason_and_not_chosen() -> None:
    hungry = Offset("hungry", SERIES, 0.0)
    hungry.min_history = lambda horizon: 10_000  # type: ignore[method-assign]
    selection = backtest(
        SERIES, [Offset("broken", SERIES, 0.0, fails=True), hungry, Offset("ok", SERIES, 1.0)], PLAN
    )
    assert selection.chosen == "ok"
    assert (selection.score("broken") or ...).error == "RuntimeError: cannot fit"  # type: ignore[union-attr]
    assert (selection.score("hungry") or ...).error == "too_little_history"  # type: ignore[union-attr]


def test_nothing_is_chosen_when_every_candidate_fails() -> None:
    selection = backtest(SERIES, [Offset("broken", SERIES, 0.0, fails=True)], PLAN)
    assert selection.chosen is None


def test_on_a_periodic_series_the_seasonal_naive_model_wins() -> None:
    period = 24
    series = [5.0 + 3.0 * math.sin(2 * math.pi * i / period) + (i % 7 == 0) * 0.0 for i in range(8 * period)]
    selection = backtest(series, default_candidates(season_steps=period), BacktestPlan(horizon=10, origins=6))
    assert selection.chosen == SeasonalNaive(period).name
    assert (selection.score(selection.chosen) or ...).mae < 1e-9  # type: ignore[union-attr]


def test_on_a_linear_autoregression_the_lagged_regression_beats_the_last_value() -> None:
    # x[t] = 0.6 x[t-1] + 0.3 x[t-2] + 1 exactly: a linear model of the lags is exact, the last value is not
    series = [1.0, 2.0]
    for _ in range(400):
        series.append(0.6 * series[-1] + 0.3 * series[-2] + 1.0 + (0.5 if len(series) % 13 == 0 else 0.0))
    selection = backtest(
        series, [SeasonalNaive(1), LaggedRegression(lags=13)], BacktestPlan(horizon=5, origins=6)
    )
    linear, naive = selection.score("linear"), selection.score("naive")
    assert linear is not None and naive is not None
    assert selection.chosen == "linear"
    assert linear.wape < naive.wape / 5


def test_the_combination_is_scored_from_its_members_backtests_and_chosen_when_asked() -> None:
    # one forecasts 1 too high, the other 1 too low: their mean is exact
    candidates = [Offset("high", SERIES, 1.0), Offset("low", SERIES, -1.0), Offset("broken", SERIES, 0, True)]
    selection = backtest(SERIES, candidates, PLAN, combine=True)
    assert selection.chosen == MEAN
    assert selection.passed == ("high", "low")
    mean = selection.score(MEAN)
    assert mean is not None and mean.mae < 1e-9 and mean.ok
    assert backtest(SERIES, candidates, PLAN).chosen == "high"  # without: the first of the tied best


def test_the_combination_forecasts_the_mean_of_the_members_that_fit() -> None:
    combined = MeanOf(
        (Offset("high", SERIES, 1.0), Offset("low", SERIES, -3.0), Offset("x", SERIES, 0, True))
    )
    fitted = combined.fit(SERIES[:100], 3)
    assert fitted.predict(SERIES[:100], 3) == [SERIES[100 + h] - 1.0 for h in range(3)]
    only_broken = MeanOf((Offset("x", SERIES, 0, True),))
    try:
        only_broken.fit(SERIES[:100], 3)
    except ValueError as exc:
        assert "no member" in str(exc)
    else:
        raise AssertionError("a combination with no member that fits must fail")


def test_a_single_scored_candidate_is_chosen_alone_even_when_combining() -> None:
    selection = backtest(
        SERIES, [Offset("ok", SERIES, 0.5), Offset("x", SERIES, 0, True)], PLAN, combine=True
    )
    assert selection.chosen == "ok" and selection.score(MEAN) is None
