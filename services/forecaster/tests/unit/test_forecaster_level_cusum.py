"""The level reset by a CUSUM on its one-step errors, the weight that blends a forecast with the last value,
and the engine serving the blend, its chooser rebuilt from the history after a restart."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from tessera.forecaster.bootstrap import engine_config
from tessera.forecaster.config import ForecasterSettings
from tessera.forecaster.domain.blend import WeightChooser, pinball
from tessera.forecaster.domain.level import LevelSmoothing, smooth
from tessera.forecaster.domain.level_cusum import LevelCusum, cusum_levels, one_step_sigma
from tessera.forecaster.service_layer.engine import EngineConfig, SeriesForecaster, served_name

from .candidates import Repeating, walk

T0 = datetime(2026, 11, 25, 4, 0, tzinfo=UTC)


def noise(n: int, mean: float, sd: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [mean + rng.gauss(0.0, sd) for _ in range(n)]


def test_no_reset_on_noise_so_the_level_is_the_plain_smoothed_one() -> None:
    values = [5.0, *noise(400, 5.0, 1.0, seed=11)]  # the level starts where the noise is centred
    assert cusum_levels(values, 0.05, 1.0) == smooth(values, 0.05)


def test_a_step_resets_the_level_to_the_mean_since_the_excursion_began() -> None:
    values = [5.0, *noise(199, 5.0, 1.0, seed=11), *noise(60, 10.0, 1.0, seed=12)]
    plain = smooth(values, 0.05)
    reset = cusum_levels(values, 0.05, 1.0)
    assert reset[:200] == plain[:200]  # nothing before the step
    # a 5-sigma step is signalled within a few steps, and the level jumps there, not 1/alpha steps later
    assert abs(reset[210] - 10.0) < 1.0 and plain[210] < 8.0
    assert abs(reset[-1] - 10.0) < 0.6
    # with no scale there is nothing to scale the errors by: no resets
    assert cusum_levels(values, 0.05, 0.0) == plain


def test_the_fit_picks_a_factor_and_scale_and_predicts_the_new_level_soon_after_a_step() -> None:
    history = noise(500, 5.0, 1.0, seed=3) + noise(15, 9.0, 1.0, seed=4)
    fitted = LevelCusum(lead=6).fit(history, 12)
    assert fitted.sigma == one_step_sigma(history, fitted.alpha, 10) > 0
    assert len(fitted.calibration) == len(history) - 10 - 6
    assert fitted.predict(history, 12) == [pytest.approx(fitted.predict(history, 1)[0])] * 12
    assert abs(fitted.predict(history, 1)[0] - 9.0) < 1.0


def test_the_chooser_serves_the_last_value_when_the_model_is_worse_and_the_model_when_it_is_better() -> None:
    rng = random.Random(5)
    model_worse = WeightChooser(q=0.9, window=240, min_judged=10)
    model_better = WeightChooser(q=0.9, window=240, min_judged=10)
    for _ in range(240):
        model_worse.observe(rng.gauss(0.0, 3.0), rng.gauss(0.0, 0.5))
        model_better.observe(rng.gauss(0.0, 0.5), rng.gauss(0.0, 3.0))
    assert model_worse.weight() == 0.0
    assert model_better.weight() == 1.0
    losses = model_worse.losses()
    assert list(losses) == [0.0, 0.25, 0.5, 0.75, 1.0] and losses[0.0] < losses[1.0]
    # errors that cancel out when blended: half and half beats either alone
    even = WeightChooser(min_judged=2)
    for i in range(100):
        e = 2.0 if i % 2 else -2.0
        even.observe(e, -e)
    assert even.weight() == 0.5


def test_the_chooser_serves_the_model_until_it_has_judged_enough_and_seeds_keep_the_newest() -> None:
    chooser = WeightChooser(window=5, min_judged=3)
    chooser.observe(5.0, 0.0)
    chooser.observe(-5.0, 0.0)
    assert chooser.weight() == 1.0 and chooser.losses() == {}
    chooser.observe(float("nan"), 0.0)  # not counted
    assert len(chooser.pairs) == 2
    assert chooser.seed([(9.0, 0.0), (8.0, 0.0), (7.0, 0.0), (6.0, 0.0)]) == 3
    assert [m for m, _ in chooser.pairs] == [8.0, 7.0, 6.0, 5.0, -5.0]
    assert chooser.weight() == 0.0  # the last value never erred
    assert pinball([0.0, 0.0, 10.0], 0.5) == pytest.approx(10.0 / 6)
    with pytest.raises(ValueError):
        WeightChooser(weights=(1.5,))


#: a candidate forecasting a constant, with no calibration (the chooser cannot be seeded from it)
FLAT = Repeating("flat", lambda history: 5.0)


def config(prefer: str = "level-cusum", blend: bool = True) -> EngineConfig:
    return EngineConfig(horizon=12, window_steps=6, prefer=prefer, blend=blend)


def test_the_engine_serves_the_blend_its_chooser_seeded_from_the_history_as_after_a_restart() -> None:
    values: list[float | None] = list(walk(400, seed=9))
    engine = SeriesForecaster(config(), lambda: [FLAT, LevelCusum(lead=6)])
    update = engine.step(values, T0, 60.0)
    assert update.forecast is not None and update.selection is not None
    assert update.selection.chosen == "level-cusum" and update.selection.score("flat") is not None
    # seeded from the model's out-of-sample errors on its training history, paired with the last value's
    assert len(engine.chooser.pairs) == 240
    weight = engine.chooser.weight()
    assert weight < 1.0  # on a random walk the last value has weight
    assert update.forecast.model == served_name("level-cusum", weight)
    fitted = engine.model.fitted if engine.model else None
    assert fitted is not None
    level = fitted.predict([v for v in values if v is not None], 12)[0]
    last = values[-1]
    assert last is not None
    assert update.forecast.values[0] == pytest.approx(weight * level + (1 - weight) * last)
    # the margin was calibrated on the blended errors, as the served base will be judged
    assert len(update.seeded) == 240
    # a restart: a new engine on the same history, the margin's errors restored from storage; the
    # chooser, whose judged origins are not stored, is rebuilt from the history to the same weight
    restarted = SeriesForecaster(config(), lambda: [FLAT, LevelCusum(lead=6)])
    restarted.seed_errors(list(engine.learner.errors))
    again = restarted.step(values, T0, 60.0)
    assert again.forecast is not None and again.forecast.model == update.forecast.model
    assert again.seeded == () and list(restarted.chooser.pairs) == list(engine.chooser.pairs)


def test_without_a_calibration_the_engine_serves_the_model_alone_until_enough_origins_are_judged() -> None:
    series = walk(400, seed=9)
    engine = SeriesForecaster(config(prefer="flat"), lambda: [FLAT, LevelCusum(lead=6)])
    names = []
    for i in range(30):
        values: list[float | None] = list(series[: 300 + i])
        update = engine.step(values, T0 + timedelta(minutes=i), 60.0)
        assert update.forecast is not None
        names.append(update.forecast.model)
    # the first origin is judged 6 steps later (the window), the 10th at step 15: the model alone before
    assert names[:15] == ["flat"] * 15
    assert len(engine.chooser.pairs) == 30 - 6
    assert names[-1] == served_name("flat", engine.chooser.weight()) != "flat"


def test_blending_off_serves_the_model_alone() -> None:
    values: list[float | None] = list(walk(400, seed=9))
    engine = SeriesForecaster(config(blend=False), lambda: [LevelCusum(lead=6)])
    update = engine.step(values, T0, 60.0)
    assert update.forecast is not None and update.forecast.model == "level-cusum"
    assert len(engine.chooser.pairs) == 0


def test_the_service_blends_the_level_by_default_and_a_setting_turns_it_off() -> None:
    assert EngineConfig().blend is True and EngineConfig().prefer == "level"
    assert engine_config(ForecasterSettings()).blend is True
    assert engine_config(ForecasterSettings(blend_last_value=False)).blend is False


def test_the_chooser_is_seeded_with_the_pairs_of_the_same_origins_and_the_margin_with_their_blend() -> None:
    values = walk(400, seed=3)
    engine = SeriesForecaster(config(prefer="level"), lambda: [LevelSmoothing(lead=6)])
    update = engine.step(list(values), T0, 60.0)
    assert update.forecast is not None
    w = 6
    history = values[-engine.config.train_steps :]
    level_fit = LevelSmoothing(lead=6).fit(history, 12)
    # the newest calibration origin is w steps before the end: its pair is that level's error and the
    # last value's error over the same w steps
    model_error, last_error = engine.chooser.pairs[-1]
    assert model_error == pytest.approx(level_fit.calibration[-1])
    assert last_error == pytest.approx(values[-1] - values[-1 - w])
    levels = smooth(history, level_fit.alpha)
    assert model_error == pytest.approx(values[-1] - levels[-1 - w])
    weight = engine.chooser.weight()
    assert update.seeded[-1] == pytest.approx(weight * model_error + (1 - weight) * last_error)


def test_a_calibration_judged_at_another_lead_seeds_no_chooser() -> None:
    values: list[float | None] = list(walk(400, seed=3))
    engine = SeriesForecaster(config(prefer="level"), lambda: [LevelSmoothing(lead=3)])
    engine.step(values, T0, 60.0)
    assert len(engine.chooser.pairs) == 0 and not engine.chooser_seeded
