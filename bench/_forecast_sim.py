"""B4's autoscaling simulation (see ``bench.forecast``): the replicas each policy keeps for the series,
what they cost, and the plot of a run."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tessera.forecaster.domain.margin import MarginLearner

PEAK_REPLICAS = 20
HPA_WINDOW = 5


class Simulation:
    def __init__(
        self,
        y: np.ndarray,
        warmup: int,
        lag: int,
        forecasts: np.ndarray,
        seeds: dict[int, tuple[float, ...]] | None = None,
    ) -> None:
        self.y, self.warmup, self.lag = y, warmup, lag
        self.seeds = seeds or {}
        self.capacity = float(y.max()) / PEAK_REPLICAS
        self.need = np.maximum(1, np.ceil(y / self.capacity - 1e-9))
        T = len(y)
        # tessera's base at each origin: the largest forecast over the next L steps (reactive where none)
        base = np.where(np.isnan(forecasts[:, 0]), y, np.nanmax(forecasts[:, :lag], axis=1))
        self.base = base
        # what it is judged against: the load at the window's end, when replicas decided at the origin
        # are up (known L steps after the origin)
        actual = np.full(T, np.nan)
        actual[: T - lag] = y[lag:]
        self.errors = actual - base
        self.reactive_errors = actual - y

    def evaluate(self, replicas: np.ndarray) -> dict[str, float]:
        r, n = replicas[self.warmup :], self.need[self.warmup :]
        return {
            "under_pct": round(float(np.mean(r < n) * 100), 3),
            "over_replicas": round(float(np.mean(np.maximum(r - n, 0))), 3),
        }

    def _replicas(self, served: np.ndarray) -> np.ndarray:
        T, L = len(self.y), self.lag
        r = np.ones(T)
        r[L:] = np.maximum(1, np.ceil(served[: T - L] / self.capacity - 1e-9))
        return r

    def reactive(self, headroom: float) -> np.ndarray:
        return self._replicas(self.y + headroom * self.capacity)

    def hpa(self, headroom: float) -> np.ndarray:
        return self._replicas(self._held(self.y + headroom * self.capacity))

    def tessera(self, q: float, window: int = 240) -> np.ndarray:
        """The service's margin learner, online: an origin's error is learnt L steps after it."""
        return self._replicas(self._learnt(self.base, self.errors, q, window, self.warmup - 1, self.seeds))

    def _learnt(
        self,
        base: np.ndarray,
        errors: np.ndarray,
        q: float,
        window: int,
        first_judged: int,
        seeds: dict[int, tuple[float, ...]] | None = None,
    ) -> np.ndarray:
        """`base` plus the q-quantile of the last `window` errors known at each origin (an origin's error
        is known L steps after it; errors of origins before `first_judged` are not learnt)."""
        T, L = len(self.y), self.lag
        learner = MarginLearner(q=q, window=window)
        served = np.array(base, dtype=float)
        for o in range(first_judged + L, self.warmup - 1):  # errors known before the first decision
            if not math.isnan(errors[o - L]):
                learner.errors.append(float(errors[o - L]))
        for o in range(self.warmup - 1, T):
            judged = o - L
            if judged >= first_judged and not math.isnan(errors[judged]):
                learner.errors.append(float(errors[judged]))
            if seeds and o in seeds:  # the engine calibrated its margin here, as the service does
                learner.seed(seeds[o])
            served[o] = base[o] + (learner.margin() or 0.0)
        return served

    def reactive_learnt(self, q: float, window: int = 240) -> np.ndarray:
        """Reactive with the protocol's learnt margin: the demand at t-L plus the q-quantile of the last
        `window` shortfalls of the demand L steps later against it (the reference's "q90 margin"
        baseline). The reactive needs no fit, so its errors over the warm-up are known and learnt."""
        return self._replicas(self._learnt(self.y, self.reactive_errors, q, window, 0))

    def hpa_learnt(self, q: float, window: int = 240) -> np.ndarray:
        """reactive_learnt with the 5-step scale-down window."""
        served = self._learnt(self.y, self.reactive_errors, q, window, 0)
        return self._replicas(self._held(served))

    def _held(self, served: np.ndarray) -> np.ndarray:
        raw = np.maximum(1, np.ceil(served / self.capacity - 1e-9))
        held = np.array([raw[max(0, i - HPA_WINDOW + 1) : i + 1].max() for i in range(len(raw))])
        return held * self.capacity

    def cost_at(
        self, policy: Callable[[float], np.ndarray], pct: float, lo: float, hi: float
    ) -> float | None:
        """over_replicas at the smallest parameter in [lo, hi] with at most pct% of steps short."""
        if self.evaluate(policy(hi))["under_pct"] > pct:
            return None
        for _ in range(18):
            mid = (lo + hi) / 2
            if self.evaluate(policy(mid))["under_pct"] > pct:
                lo = mid
            else:
                hi = mid
        return self.evaluate(policy(hi))["over_replicas"]


def policy_figures(
    sim: Simulation, policy: Callable[[float], np.ndarray], default: float, hi: float
) -> dict[str, Any]:
    figures: dict[str, Any] = sim.evaluate(policy(default))
    figures["cost_at_5pct"] = sim.cost_at(policy, 5.0, 0.0, hi)
    figures["cost_at_1pct"] = sim.cost_at(policy, 1.0, 0.0, hi)
    return figures


def plot(path: Path, y: np.ndarray, forecasts: np.ndarray, sim: Simulation, q: float, source: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    L = sim.lag
    t = np.arange(len(y)) / 60.0
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    shifted = np.full(len(y), np.nan)
    shifted[L:] = forecasts[: len(y) - L, L - 1]
    top.plot(t, y, lw=0.8, color="black", label="actual demand")
    top.plot(t, shifted, lw=0.8, color="tab:blue", alpha=0.8, label=f"forecast made {L} min ahead")
    top.set_ylabel("load")
    top.legend(loc="upper left", fontsize=8)
    bottom.step(t, sim.need, lw=0.8, color="black", label="replicas needed")
    bottom.step(t, sim.reactive_learnt(q), lw=0.8, color="tab:red", alpha=0.7, label=f"reactive (q = {q})")
    bottom.step(t, sim.tessera(q), lw=0.8, color="tab:blue", alpha=0.8, label=f"tessera (q = {q})")
    bottom.axvline(sim.warmup / 60.0, color="grey", ls=":", lw=0.8)
    bottom.set_ylabel(f"replicas (lag {L})")
    bottom.set_xlabel("hours")
    bottom.legend(loc="upper left", fontsize=8)
    fig.suptitle(f"B4: forecast vs actual vs replicas — {source}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
