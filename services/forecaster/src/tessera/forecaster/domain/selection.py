"""Choosing a model per series by a rolling-origin backtest on its recent history. Pure: the models are
ports (`Candidate`), the darts ones live in the adapters."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol


class Fitted(Protocol):
    def predict(self, history: Sequence[float], horizon: int) -> list[float]:
        """Forecasts of the `horizon` steps after `history`'s last value (history may run past what the
        model was fit on: a fitted model is applied to newer data, or refit on it where that is cheap)."""
        ...


class Candidate(Protocol):
    @property
    def name(self) -> str: ...

    def min_history(self, horizon: int) -> int:
        """Steps of history it needs to be fit for this horizon."""
        ...

    def fit(self, history: Sequence[float], horizon: int) -> Fitted: ...


#: the name of the combination of every candidate the backtest could score
MEAN = "mean"


@dataclass(frozen=True)
class BacktestPlan:
    """Origins at the end of the history, `stride` steps apart; each forecasts `horizon` steps that are
    known. Models are fit once on the history before the first origin (at most `train_steps` of it), then
    rolled forward over the origins."""

    horizon: int
    origins: int = 12
    stride: int = 5
    train_steps: int = 720

    def origin_indices(self, n: int) -> list[int]:
        """Indices of each origin's first unseen step, oldest first."""
        last = n - self.horizon
        return [last - i * self.stride for i in range(self.origins - 1, -1, -1) if last - i * self.stride > 0]


@dataclass(frozen=True)
class Score:
    name: str
    mae: float = math.inf
    wape: float = math.inf
    under_share: float = 0.0
    """share of forecast steps more than 10% under the actual value"""
    by_horizon: tuple[float, ...] = ()
    """MAE at each horizon"""
    fit_s: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and math.isfinite(self.wape)


@dataclass(frozen=True)
class Selection:
    chosen: str | None
    scores: tuple[Score, ...] = field(default_factory=tuple)

    def score(self, name: str) -> Score | None:
        return next((s for s in self.scores if s.name == name), None)

    @property
    def passed(self) -> tuple[str, ...]:
        """The candidates the backtest could score (fit, finite forecasts), in candidate order."""
        return tuple(s.name for s in self.scores if s.ok and s.name != MEAN)


def _score(
    name: str, predictions: Sequence[Sequence[float]], actuals: Sequence[Sequence[float]], horizon: int
) -> Score:
    errors: list[list[float]] = [[] for _ in range(horizon)]
    abs_sum = actual_sum = 0.0
    under = count = 0
    for predicted, actual in zip(predictions, actuals, strict=True):
        for h, (p, a) in enumerate(zip(predicted, actual, strict=False)):
            if not math.isfinite(p):
                raise ValueError("forecast is not finite")
            errors[h].append(abs(a - p))
            abs_sum += abs(a - p)
            actual_sum += abs(a)
            under += a - p > 0.1 * abs(a)
            count += 1
    return Score(
        name,
        mae=abs_sum / count if count else math.inf,
        wape=abs_sum / actual_sum if actual_sum > 0 else math.inf,
        under_share=under / count if count else 0.0,
        by_horizon=tuple(sum(e) / len(e) if e else math.inf for e in errors),
    )


def backtest(
    values: Sequence[float],
    candidates: Sequence[Candidate],
    plan: BacktestPlan,
    clock: Callable[[], float] = time.perf_counter,
    *,
    combine: bool = False,
) -> Selection:
    """Score every candidate over the same origins; choose the lowest WAPE (the first candidate on ties).
    A candidate that needs more history than the first origin has, or fails, is scored with its reason.

    With `combine`, the mean of every candidate that could be scored is scored too (from their own
    backtest forecasts, so at no extra fitting) and is the choice whenever two or more could: a
    combination's errors vary less than its members', and choosing among close scores over a few
    origins mostly follows noise."""
    origins = plan.origin_indices(len(values))
    actuals = [values[o : o + plan.horizon] for o in origins]
    scores: list[Score] = []
    forecasts: dict[str, list[list[float]]] = {}
    for candidate in candidates:
        if not origins or origins[0] < candidate.min_history(plan.horizon):
            scores.append(Score(candidate.name, error="too_little_history"))
            continue
        started = clock()
        try:
            fitted = candidate.fit(values[max(0, origins[0] - plan.train_steps) : origins[0]], plan.horizon)
            predictions = [
                fitted.predict(values[max(0, o - plan.train_steps) : o], plan.horizon) for o in origins
            ]
            score = _score(candidate.name, predictions, actuals, plan.horizon)
        except Exception as exc:  # a model that cannot fit this series is not chosen; the loop goes on
            scores.append(Score(candidate.name, error=f"{type(exc).__name__}: {exc}"[:200]))
            continue
        forecasts[candidate.name] = predictions
        scores.append(
            Score(score.name, score.mae, score.wape, score.under_share, score.by_horizon, clock() - started)
        )
    ok = [s for s in scores if s.ok]
    if combine and len(ok) > 1:
        members = [forecasts[s.name] for s in ok]
        mean = [
            [sum(m[i][h] for m in members) / len(members) for h in range(len(members[0][i]))]
            for i in range(len(origins))
        ]
        combined = _score(MEAN, mean, actuals, plan.horizon)
        scores.append(
            Score(
                MEAN,
                combined.mae,
                combined.wape,
                combined.under_share,
                combined.by_horizon,
                sum(s.fit_s for s in ok),
            )
        )
        return Selection(MEAN, tuple(scores))
    chosen = min(ok, key=lambda s: s.wape).name if ok else None
    return Selection(chosen, tuple(scores))


@dataclass(frozen=True)
class _MeanFitted:
    members: tuple[Fitted, ...]

    def predict(self, history: Sequence[float], horizon: int) -> list[float]:
        rows = [m.predict(history, horizon) for m in self.members]
        return [sum(r[h] for r in rows) / len(rows) for h in range(horizon)]


@dataclass(frozen=True)
class MeanOf:
    """The mean of its members' forecasts, with equal weights (a forecast combination): averaging models
    whose errors are not perfectly correlated lowers the error's variance, which is what the margin has
    to cover. A member that cannot fit is left out; it fails only when none fits."""

    members: tuple[Candidate, ...]

    @property
    def name(self) -> str:
        return MEAN

    def min_history(self, horizon: int) -> int:
        return max(c.min_history(horizon) for c in self.members)

    def fit(self, history: Sequence[float], horizon: int) -> Fitted:
        fitted = []
        for member in self.members:
            try:
                fitted.append(member.fit(history, horizon))
            except Exception:  # left out of the mean; the others still combine
                continue
        if not fitted:
            raise ValueError("no member of the combination could be fit")
        return _MeanFitted(tuple(fitted))
