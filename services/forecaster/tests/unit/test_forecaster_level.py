"""The level smoothed for the lead, served in preference to the backtest's choice, and the margin
calibrated from its out-of-sample errors before any forecast is judged."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from tessera.forecaster.domain.level import LevelSmoothing, lead_errors, smooth
from tessera.forecaster.domain.margin import MarginLearner
from tessera.forecaster.service_layer.engine import EngineConfig, SeriesForecaster

from .candidates import Repeating, last_value

T0 = datetime(2026, 11, 25, 4, 0, tzinfo=UTC)


def noisy_level(n: int, noise: float, shift_every: int, seed: int = 7) -> list[float]:
    """A level that jumps now and then, under white noise."""
    rng = random.Random(seed)
    level, out = 5.0, []
    for i in range(n):
        if i and i % shift_every == 0:
            level = rng.uniform(2.0, 8.0)
        out.append(level + rng.gauss(0.0, noise))
    return out


def test_smoothing_follows_the_level_and_errors_are_judged_lead_steps_later() -> None:
    assert smooth([4.0, 8.0, 8.0], 0.5) == [4.0, 6.0, 7.0]
    assert lead_errors([1.0, 2.0, 3.0, 5.0], [1.0, 2.0, 3.0, 5.0], lead=2, skip=0) == [2.0, 3.0]


def test_noise_gets_a_small_factor_and_a_moving_level_a_large_one() -> None:
    noisy = LevelSmoothing(lead=6).fit(noisy_level(720, noise=1.0, shift_every=10_000), 12)
    walk = [0.0]
    rng = random.Random(3)
    for _ in range(719):
        walk.append(walk[-1] + rng.gauss(0.0, 1.0))
    moving = LevelSmoothing(lead=6).fit(walk, 12)
    assert noisy.alpha <= 0.1 < 0.8 <= moving.alpha
    # the forecast is flat at the smoothed level: near the true level 5, not the last noisy reading
    history = noisy_level(720, noise=1.0, shift_every=10_000)
    assert all(abs(v - 5.0) < 0.6 for v in noisy.predict(history, 12))
    assert len(noisy.calibration) == 720 - 10 - 6


def test_the_margin_is_seeded_before_judged_errors_and_keeps_the_newest_that_fit() -> None:
    learner = MarginLearner(q=1.0, window=5, min_errors=3)
    learner.observe(0.0, 1.0)
    kept = learner.seed([9.0, 8.0, 7.0, 6.0, 5.0, 4.0])
    assert kept == 4 and list(learner.errors) == [7.0, 6.0, 5.0, 4.0, 1.0]
    assert learner.seed([100.0]) == 0  # full: nothing more
    learner.observe(0.0, 2.0)  # judged errors push the seeds out first
    assert list(learner.errors) == [6.0, 5.0, 4.0, 1.0, 2.0]


#: a candidate the backtest would prefer, forecasting the last value
WRONG = Repeating("last", last_value)


def test_the_engine_serves_the_level_and_calibrates_its_margin_once() -> None:
    config = EngineConfig(horizon=12, window_steps=6, min_errors=10, margin_q=0.9, margin_window=240)
    values: list[float | None] = list(noisy_level(300, noise=1.0, shift_every=10_000))
    engine = SeriesForecaster(config, lambda: [WRONG, LevelSmoothing(lead=6)])
    first = engine.step(values, T0, 60.0)
    assert first.forecast is not None and first.forecast.model == "level"
    assert first.selection is not None and first.selection.chosen == "level"
    assert first.selection.score("last") is not None  # still scored, for status
    # calibrated at once: a margin before any forecast was judged, about the noise's 90th percentile
    assert len(first.seeded) == 240 and engine.learner.margin() == first.forecast.margin
    assert 0.8 < first.forecast.margin < 2.5
    second = engine.step(values, T0.replace(minute=1), 60.0)
    assert second.seeded == ()  # only once
    unseeded = SeriesForecaster(
        EngineConfig(horizon=12, window_steps=6, prefer=None, calibrate=False),
        lambda: [WRONG, LevelSmoothing(lead=6)],
    )
    plain = unseeded.step(values, T0, 60.0)
    assert plain.forecast is not None and plain.forecast.margin == 0.0 and plain.seeded == ()
