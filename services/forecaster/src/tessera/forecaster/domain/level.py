"""A smoothed level fit for the lead at which the forecast is acted on. Pure.

Minute-level load is mostly noise around a level that moves: at the actuation lag (the window, 3 to 6
steps) a forecast cannot see the noise coming, only the level. Simple exponential smoothing estimates
that level; its one parameter is fit by least squares of the level against the load `lead` steps later
over the whole training history (half a day), so the choice is stable from one refit to the next
rather than following the few origins of an hourly backtest. The same pass yields out-of-sample errors
at the lead (each level uses only the steps before it), which calibrate the margin from the start."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: the smoothing factors tried, coarse enough that the fit is cheap and stable
ALPHAS = tuple(round(0.05 * i, 2) for i in range(1, 21))


def smooth(values: Sequence[float], alpha: float) -> list[float]:
    """The exponentially smoothed level after each step (the first step starts it)."""
    level = values[0]
    out = []
    for v in values:
        level = alpha * v + (1.0 - alpha) * level
        out.append(level)
    return out


def lead_errors(values: Sequence[float], levels: Sequence[float], lead: int, skip: int) -> list[float]:
    """`actual - level` of each level (after the first `skip`) against the load `lead` steps later."""
    return [values[i + lead] - levels[i] for i in range(skip, len(values) - lead)]


def fit_alpha(
    values: Sequence[float], lead: int, skip: int, levels_of: Callable[[float], Sequence[float]]
) -> tuple[float, list[float]]:
    """The factor in `ALPHAS` whose levels (`levels_of(alpha)`) err least, in squares, against the load
    `lead` steps later, and those errors (out of sample: each level uses only the steps before it)."""
    best: tuple[float, float, list[float]] | None = None
    for alpha in ALPHAS:
        errors = lead_errors(values, levels_of(alpha), lead, skip)
        sse = sum(e * e for e in errors)
        if best is None or sse < best[0]:
            best = (sse, alpha, errors)
    assert best is not None
    return best[1], best[2]


@dataclass(frozen=True)
class LevelFitted:
    alpha: float
    context: int
    calibration: tuple[float, ...]
    """out-of-sample errors at the lead on the history it was fit on, oldest first"""
    lead: int = 6
    """the steps ahead each calibration error was judged at"""

    def predict(self, history: Sequence[float], horizon: int) -> list[float]:
        level = smooth(history[-self.context :], self.alpha)[-1]
        return [level] * horizon


@dataclass(frozen=True)
class LevelSmoothing:
    """Simple exponential smoothing, its factor fit for the error at `lead` steps; a flat forecast."""

    lead: int = 6
    context: int = 240
    """steps the level is smoothed over when predicting (0.95^240: the start no longer matters)"""
    skip: int = 10
    """levels not judged at the start of the history, while the level settles"""
    name: str = "level"

    def min_history(self, horizon: int) -> int:
        return self.skip + self.lead + 20

    def fit(self, history: Sequence[float], horizon: int) -> LevelFitted:
        values = [float(v) for v in history]
        if len(values) < self.min_history(horizon):
            raise ValueError("too little history")
        alpha, errors = fit_alpha(values, self.lead, self.skip, lambda a: smooth(values, a))
        return LevelFitted(alpha, self.context, tuple(errors), self.lead)
