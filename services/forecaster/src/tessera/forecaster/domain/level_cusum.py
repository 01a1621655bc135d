"""The smoothed level, reset when a two-sided CUSUM on its one-step errors signals a shift. Pure.

Smoothing slowly enough to ignore minute-level noise also follows a real step in the load slowly: for
tens of minutes after it the level lags, and the margin learnt in those minutes is paid for later. A
tabular CUSUM (Page) on the level's one-step errors, scaled by their standard deviation, detects a
sustained shift: S+ = max(0, S+ + z - k), S- = max(0, S- - z - k); when either passes h the level jumps
to the mean of the readings since that excursion began (since the statistic last stood at 0), both
statistics restart, and smoothing goes on from there. k and h are the textbook design for detecting a
shift of one standard deviation (Montgomery, Introduction to Statistical Quality Control: k = 0.5,
h = 4 or 5 standard deviations), fixed here, not fit. The standard deviation is that of the plain
level's one-step errors over the training history; the smoothing factor is fit, as `LevelSmoothing`'s
is, by least squares of the reset level against the load `lead` steps later, which also yields the
out-of-sample errors that calibrate the margin."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.forecaster.domain.level import fit_alpha, smooth

#: the CUSUM's reference value and decision interval, in standard deviations of the one-step error
K = 0.5
H = 5.0


def cusum_levels(
    values: Sequence[float], alpha: float, sigma: float, k: float = K, h: float = H
) -> list[float]:
    """The level after each step: smoothed by `alpha`, and reset to the mean since an excursion began
    whenever a two-sided CUSUM of the one-step errors / `sigma` passes `h` (no resets if sigma <= 0)."""
    if not values:
        return []
    level = values[0]
    out = [level]
    up = down = 0.0
    up_sum = down_sum = 0.0  # readings since each excursion began, and how many
    up_n = down_n = 0
    for v in values[1:]:
        z = (v - level) / sigma if sigma > 0 else 0.0
        if up == 0.0:
            up_sum, up_n = 0.0, 0
        if down == 0.0:
            down_sum, down_n = 0.0, 0
        up = max(0.0, up + z - k)
        down = max(0.0, down - z - k)
        up_sum, up_n = up_sum + v, up_n + 1
        down_sum, down_n = down_sum + v, down_n + 1
        if up > h or down > h:
            level = up_sum / up_n if up >= down else down_sum / down_n
            up = down = 0.0
        else:
            level = alpha * v + (1.0 - alpha) * level
        out.append(level)
    return out


def one_step_sigma(values: Sequence[float], alpha: float, skip: int) -> float:
    """The standard deviation of the plain smoothed level's one-step errors (after the first `skip`)."""
    levels = smooth(values, alpha)
    errors = [values[i + 1] - levels[i] for i in range(skip, len(values) - 1)]
    if len(errors) < 2:
        return 0.0
    mean = sum(errors) / len(errors)
    return math.sqrt(sum((e - mean) ** 2 for e in errors) / len(errors))


@dataclass(frozen=True)
class LevelCusumFitted:
    alpha: float
    sigma: float
    context: int
    calibration: tuple[float, ...]
    """out-of-sample errors at the lead on the history it was fit on, oldest first"""
    k: float = K
    h: float = H
    lead: int = 6
    """the steps ahead each calibration error was judged at"""

    def predict(self, history: Sequence[float], horizon: int) -> list[float]:
        level = cusum_levels(history[-self.context :], self.alpha, self.sigma, self.k, self.h)[-1]
        return [level] * horizon


@dataclass(frozen=True)
class LevelCusum:
    """`LevelSmoothing` with CUSUM resets; a flat forecast."""

    lead: int = 6
    context: int = 240
    """steps the level is computed over when predicting (the CUSUM starts afresh at their start)"""
    skip: int = 10
    name: str = "level-cusum"
    k: float = K
    h: float = H

    def min_history(self, horizon: int) -> int:
        return self.skip + self.lead + 20

    def fit(self, history: Sequence[float], horizon: int) -> LevelCusumFitted:
        values = [float(v) for v in history]
        if len(values) < self.min_history(horizon):
            raise ValueError("too little history")

        def levels_of(alpha: float) -> list[float]:
            return cusum_levels(values, alpha, one_step_sigma(values, alpha, self.skip), self.k, self.h)

        alpha, errors = fit_alpha(values, self.lead, self.skip, levels_of)
        sigma = one_step_sigma(values, alpha, self.skip)
        return LevelCusumFitted(alpha, sigma, self.context, tuple(errors), self.k, self.h, self.lead)
