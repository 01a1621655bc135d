"""Seeding the margin and the chooser from a fit's out-of-sample errors never counts an origin twice:
only origins older than the first judged (or restored) one are seeded."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from tessera.forecaster.domain.level import LevelSmoothing
from tessera.forecaster.domain.selection import Fitted
from tessera.forecaster.service_layer.engine import EngineConfig, SeriesForecaster

from .candidates import walk

T0 = datetime(2026, 11, 25, 4, 0, tzinfo=UTC)
STEP = timedelta(minutes=1)


class Predicts:
    """A fit's forecasts without its calibration."""

    def __init__(self, fitted: Fitted) -> None:
        self.fitted = fitted

    def predict(self, history: Sequence[float], horizon: int) -> list[float]:
        return self.fitted.predict(history, horizon)


class CalibratedFromTheSecondFit:
    """The level, whose first fit gives no out-of-sample errors (as a model that cannot) and later ones do."""

    name = "level"

    def __init__(self) -> None:
        self.fits = 0
        self.level = LevelSmoothing(lead=6)

    def min_history(self, horizon: int) -> int:
        return self.level.min_history(horizon)

    def fit(self, history: Sequence[float], horizon: int) -> Fitted:
        self.fits += 1
        fitted = self.level.fit(history, horizon)
        return fitted if self.fits > 2 else Predicts(fitted)  # the backtest's fit, then the served one


def test_a_refit_seeds_the_chooser_and_the_margin_only_with_origins_before_the_first_judged() -> None:
    series = walk(400, seed=4)
    candidate = CalibratedFromTheSecondFit()
    engine = SeriesForecaster(EngineConfig(refit_every_steps=20), lambda: [candidate])
    seeded: tuple[float, ...] = ()
    for i in range(21):  # origins T0 .. T0 + 20 min; values[k] is at T0 + (k - 299) min
        update = engine.step(list(series[: 300 + i]), T0 + i * STEP, 60.0)
        assert update.forecast is not None
        seeded = seeded or update.seeded
    judged = 20 - 6 + 1  # origins T0 .. T0 + 14 min, judged 6 steps on
    pairs = list(engine.chooser.pairs)
    assert len(pairs) == 240
    # the newest seeded pair is the origin a step before T0 (index 298), judged 6 steps later
    assert pairs[-judged - 1][1] == pytest.approx(series[304] - series[298])
    # not the newest origin of the refit's history (T0 + 14 min), which was judged already
    assert pairs[-judged - 1][1] != pytest.approx(series[319] - series[313])
    assert pairs[-1][1] == pytest.approx(series[319] - series[313])  # that one, once: as judged
    assert len(seeded) == 240 - judged
    assert engine.chooser_from == T0 and engine.margin_from == T0


def test_a_restart_seeds_the_margin_only_with_origins_before_the_restored_errors() -> None:
    values: list[float | None] = list(walk(400, seed=9))
    end = T0
    fresh = SeriesForecaster(EngineConfig(), lambda: [LevelSmoothing(lead=6)])
    full = fresh.step(values, end, 60.0).seeded
    assert len(full) == 240  # nothing judged or restored: the newest 240 origins, the last at end - 6
    restarted = SeriesForecaster(EngineConfig(), lambda: [LevelSmoothing(lead=6)])
    restored = [0.5] * 10  # origins end - 15 .. end - 6 min
    restarted.seed_errors(restored, since=end - 15 * STEP)
    again = restarted.step(values, end, 60.0).seeded
    assert list(again) == pytest.approx(list(full[-240:-10]))
    assert list(restarted.learner.errors) == pytest.approx([*full[-240:-10], *restored])


def test_origins_count_from_the_newest_reading_when_the_last_steps_are_missing() -> None:
    values: list[float | None] = [*walk(400, seed=9), None, None]  # two stale steps, within tolerance
    end = T0  # the grid's last step; the history the fit sees ends two steps before
    full = SeriesForecaster(EngineConfig(), lambda: [LevelSmoothing(lead=6)]).step(values, end, 60.0).seeded
    restarted = SeriesForecaster(EngineConfig(), lambda: [LevelSmoothing(lead=6)])
    newest = end - 2 * STEP
    restarted.seed_errors([0.5] * 10, since=newest - 15 * STEP, until=newest - 6 * STEP)
    assert list(restarted.step(values, end, 60.0).seeded) == pytest.approx(list(full[-240:-10]))


def test_errors_restored_from_before_the_whole_history_leave_the_calibration_whole() -> None:
    values: list[float | None] = list(walk(400, seed=9))
    full = SeriesForecaster(EngineConfig(), lambda: [LevelSmoothing(lead=6)]).step(values, T0, 60.0).seeded
    restarted = SeriesForecaster(EngineConfig(), lambda: [LevelSmoothing(lead=6)])
    long_ago = T0 - timedelta(days=3)  # down for longer than the training history
    restarted.seed_errors([0.5] * 10, since=long_ago - 9 * STEP, until=long_ago)
    assert list(restarted.step(values, T0, 60.0).seeded) == pytest.approx(list(full[-230:]))
