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


def backtest(
    values: Sequence[float],
    candidates: Sequence[Candidate],
    plan: BacktestPlan,
    clock: Callable[[], float] = time.perf_counter,
) -> Selection:
    """Score every candidate over the same origins; choose the lowest WAPE (the first candidate on ties).
    A candidate that needs more history than the first origin has, or fails, is scored with its reason."""
    origins = plan.origin_indices(len(values))
    scores: list[Score] = []
    for candidate in candidates:
        if not origins or origins[0] < candidate.min_history(plan.horizon):
            scores.append(Score(candidate.name, error="too_little_history"))
            continue
        started = clock()
        try:
            fitted = candidate.fit(values[max(0, origins[0] - plan.train_steps) : origins[0]], plan.horizon)
            errors: list[list[float]] = [[] for _ in range(plan.horizon)]
            abs_sum = actual_sum = 0.0
            under = count = 0
            for origin in origins:
                predicted = fitted.predict(values[max(0, origin - plan.train_steps) : origin], plan.horizon)
                actual = values[origin : origin + plan.horizon]
                for h, (p, a) in enumerate(zip(predicted, actual, strict=False)):
                    if not math.isfinite(p):
                        raise ValueError("forecast is not finite")
                    errors[h].append(abs(a - p))
                    abs_sum += abs(a - p)
                    actual_sum += abs(a)
                    under += a - p > 0.1 * abs(a)
                    count += 1
        except Exception as exc:  # a model that cannot fit this series is not chosen; the loop goes on
            scores.append(Score(candidate.name, error=f"{type(exc).__name__}: {exc}"[:200]))
            continue
        by_h = tuple(sum(e) / len(e) if e else math.inf for e in errors)
        scores.append(
            Score(
                candidate.name,
                mae=abs_sum / count,
                wape=abs_sum / actual_sum if actual_sum > 0 else math.inf,
                under_share=under / count,
                by_horizon=by_h,
                fit_s=clock() - started,
            )
        )
    ok = [s for s in scores if s.ok]
    chosen = min(ok, key=lambda s: s.wape).name if ok else None
    return Selection(chosen, tuple(scores))
