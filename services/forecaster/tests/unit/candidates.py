"""Candidate models for the engine's tests: one forecast repeated over the horizon, with no
calibration (so neither the margin nor the chooser can be seeded from their fit)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tessera.forecaster.domain.selection import Fitted


@dataclass(frozen=True)
class _Repeats:
    forecast: Callable[[Sequence[float]], float]

    def predict(self, history: Sequence[float], horizon: int) -> list[float]:
        return [self.forecast(history)] * horizon


@dataclass(frozen=True)
class Repeating:
    """A candidate named `name` whose forecast is `forecast(history)` at every step ahead."""

    name: str
    forecast: Callable[[Sequence[float]], float]
    history: int = 2

    def min_history(self, horizon: int) -> int:
        return self.history

    def fit(self, history: Sequence[float], horizon: int) -> Fitted:
        return _Repeats(self.forecast)


def last_value(history: Sequence[float]) -> float:
    return history[-1]


def walk(n: int, seed: int) -> list[float]:
    """A random walk well above zero: the last value forecasts it best."""
    rng = random.Random(seed)
    out = [50.0]
    for _ in range(n - 1):
        out.append(max(1.0, out[-1] + rng.gauss(0.0, 2.0)))
    return out
