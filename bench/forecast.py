"""B4 — forecast-driven scaling on a real load series (BENCHMARKS.md, B4).

    python -m bench.forecast --json bench/results/forecast.json --plot bench/results/forecast.png
    python -m bench.forecast --series pod_gpu_duty_cycle.csv.gz --time-col timestamp_anon \\
        --value-col value --json bench/results/forecast_duty_cycle.json

Input: a CSV (optionally gzipped) of readings. Rows with the same `--time-col` value form a window, and
a window's value is the sum of `--value-col` over its rows (or, with `--count`, its number of rows).
The series is the mean over each `--step` of its windows' values; steps with no window are filled by
linear interpolation (their count is reported). Default: the GenAI gateway QPS trace shipped in the repo.

Accuracy: a rolling-origin backtest after `--warmup` steps (default 2 hours): at every origin the
forecaster (`tessera.forecaster`, as it runs in the service: every hour a backtest scores each candidate
and the mean of those it could score, that combination forecasts every step) forecasts the next steps;
MAE, WAPE and the share of steps under-forecast by more than 10% at horizons 1, 5 and 10. The same run
also replays the forecaster with the combination off (the backtest's single best model, as before it),
reported as `tessera_single_model`.

Autoscaling: the capacity per replica makes the peak need 20 replicas, the minimum is 1. With a lag L
(the demand seen one step late, then a pod start of L-1 steps), the replicas serving step t are decided
from what was known at t-L:
  reactive   the demand at t-L plus a margin learnt online as tessera's is (the reference's "q90
             margin" baseline): the q-quantile of the last 240 shortfalls of the demand L steps after
             an origin against the demand at it, each learnt once known (the warm-up's too: it needs
             no fit);
  hpa        reactive, with a 5-step scale-down window (the largest recommendation of the last 5 steps);
  reactive_headroom, hpa_headroom
             the same with a constant headroom of h replicas instead (the bench's baselines before;
             `--baselines` picks either or both);
  tessera    the largest forecast over the next L steps from t-L, plus the margin learned online: the
             q-quantile of the last 240 shortfalls of that value against the load at the window's end
             (when replicas decided at the origin are up), each judged once known.
under_pct is the share of steps with fewer replicas than ceil(demand / capacity); over_replicas the mean
of the replicas above it. cost_at_X searches each policy's one margin parameter (h, h, q) so that X% of
steps are under-provisioned and reports over_replicas there (null when no value reaches it). The
defaults are h = 0 and q = 0.9 (under_pct and over_replicas are reported there).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core, as the goal is stated

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from datetime import UTC, datetime, timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from tessera.devcluster.data import GENAI_QPS, trace  # noqa: E402
from tessera.forecaster.adapters.models import default_candidates  # noqa: E402
from tessera.forecaster.domain.forecast import Forecast, serve  # noqa: E402
from tessera.forecaster.domain.margin import MarginLearner  # noqa: E402
from tessera.forecaster.service_layer.engine import EngineConfig, SeriesForecaster  # noqa: E402

RESULTS = Path(__file__).parent / "results"
LAGS = (3, 6)
HORIZONS = (1, 5, 10)
PEAK_REPLICAS = 20
HPA_WINDOW = 5


def parse_time(raw: str) -> float:
    """Epoch seconds, or an ISO 8601 datetime (naive ones are UTC)."""
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise SystemExit(f"time {raw!r}: neither epoch seconds nor an ISO 8601 datetime") from exc
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def load_series(
    path: Path, time_col: str, value_col: str | None, count: bool, step_s: float
) -> tuple[np.ndarray, int]:
    """The series on a regular grid of `step_s`, and how many of its steps were filled."""
    opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
    import csv

    windows: dict[float, float] = {}
    with opener(path, "rt", newline="") as f:
        for row in csv.DictReader(f):
            raw_t = row.get(time_col, "")
            if raw_t in ("", None):
                continue
            t = parse_time(raw_t)
            if count:
                windows[t] = windows.get(t, 0.0) + 1.0
            else:
                raw_v = row.get(value_col or "", "")
                if raw_v in ("", None):
                    continue
                windows[t] = windows.get(t, 0.0) + float(raw_v)
    if not windows:
        raise SystemExit(f"{path}: no readings in columns {time_col!r}/{value_col!r}")
    sums: dict[int, list[float]] = {}
    for t, v in windows.items():
        sums.setdefault(math.floor(t / step_s), []).append(v)
    first, last = min(sums), max(sums)
    y = np.full(last - first + 1, np.nan)
    for k, vs in sums.items():
        y[k - first] = sum(vs) / len(vs)
    missing = np.isnan(y)
    if missing.any():
        idx = np.arange(len(y))
        y[missing] = np.interp(idx[missing], idx[~missing], y[~missing])
    return y, int(missing.sum())


def run_forecaster(
    y: np.ndarray, warmup: int, config: EngineConfig
) -> tuple[np.ndarray, list[str], list[float], dict[int, tuple[float, ...]]]:
    """Forecasts from every origin o >= warmup - 1 (row o: the steps o+1 … o+horizon), as the service makes
    them step by step; NaN rows where it fell back. Also the model used at each origin, refit times, and
    the errors that calibrated the margin at the origin where the engine seeded it."""
    T = len(y)
    engine = SeriesForecaster(config, lambda: default_candidates(lead=config.window_steps))
    out = np.full((T, config.horizon), np.nan)
    used = [""] * T
    seeds: dict[int, tuple[float, ...]] = {}
    start = datetime(2026, 1, 1, tzinfo=UTC)
    history_steps = config.train_steps + 60
    for o in range(warmup - 1, T - 1):
        window = y[max(0, o + 1 - history_steps) : o + 1]
        update = engine.step(list(window), start + timedelta(minutes=o), 60.0)
        if update.seeded:
            seeds[o] = update.seeded
        if update.forecast is not None:
            out[o] = update.forecast.values
            used[o] = update.forecast.model
    return out, used, engine.fit_seconds, seeds


def accuracy(y: np.ndarray, f: np.ndarray, warmup: int) -> dict[str, dict[str, float]]:
    out = {}
    T = len(y)
    for h in HORIZONS:
        origins = [o for o in range(warmup - 1, T - h) if not math.isnan(f[o, h - 1])]
        pred = np.array([f[o, h - 1] for o in origins])
        actual = np.array([y[o + h] for o in origins])
        err = np.abs(actual - pred)
        out[f"h{h}"] = {
            "mae": round(float(err.mean()), 4),
            "wape": round(float(err.sum() / np.abs(actual).sum()), 4),
            "under_10pct_share": round(float(np.mean(actual - pred > 0.1 * np.abs(actual))), 4),
        }
    return out


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


def refit_seconds(y: np.ndarray, config: EngineConfig, repeats: int) -> tuple[float, float]:
    """Median wall and CPU seconds of one refit on the last day, through the engine as the service runs it:
    the backtest of every candidate, the served model fit, and its first forecast. The CPU time is the
    process's (every thread; numeric libraries are held to one): on a shared machine the wall time
    measures the other tenants as much as the refit."""
    day = [float(v) for v in y[-1440:]]
    at = datetime(2026, 1, 2, tzinfo=UTC)
    walls, cpus = [], []
    for _ in range(repeats + 1):  # the first one compiles what numba compiles
        engine = SeriesForecaster(config, lambda: default_candidates(lead=config.window_steps))
        started, cpu_started = time.perf_counter(), time.process_time()
        update = engine.step(day, at, 60.0)
        walls.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu_started)
        assert update.forecast is not None, update.degraded
    return statistics.median(walls[1:]), statistics.median(cpus[1:])


def serve_p99_ms(forecasts: np.ndarray, requests: int) -> float:
    """The request path: the window maximum of a precomputed forecast plus its margin (no fitting)."""
    origin = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [r for r in forecasts if not math.isnan(r[0])][:200]
    stored = [Forecast(origin, 60.0, tuple(float(v) for v in r), "m", 0.5, 1.0, 1.0) for r in rows]
    times = []
    for i in range(requests):
        started = time.perf_counter()
        serve(stored[i % len(stored)], now=origin + timedelta(seconds=30), window_s=360, last_value=1.0)
        times.append(time.perf_counter() - started)
    return float(np.percentile(times, 99) * 1000)


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


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--series", type=Path, default=None, help="CSV or CSV.gz (default: the GenAI QPS trace)"
    )
    parser.add_argument(
        "--time-col",
        default="timestamp_anon",
        help="column of the window's time: epoch seconds or ISO 8601",
    )
    value = parser.add_mutually_exclusive_group()
    value.add_argument("--value-col", default=None, help="column summed over a window's rows (default value)")
    value.add_argument("--count", action="store_true", help="a window's value is its number of rows")
    parser.add_argument("--step", type=float, default=60.0, help="seconds per step (default 60)")
    parser.add_argument("--warmup", type=int, default=None, help="steps of warm-up (default: 2 hours)")
    parser.add_argument("--q", type=float, default=0.9, help="tessera's default margin quantile")
    parser.add_argument(
        "--baselines",
        choices=("learnt", "headroom", "both"),
        default="both",
        help="the reactive and HPA baselines' margin: learnt online like tessera's (q-quantile of the "
        "last 240 shortfalls, the reference's 'q90 margin'; rows reactive, hpa), a constant headroom of h "
        "replicas (the bench before; rows reactive_headroom, hpa_headroom), or both (default)",
    )
    parser.add_argument("--refit-repeats", type=int, default=5)
    parser.add_argument(
        "--no-before",
        action="store_true",
        help="skip the replay of the forecaster before the level model (the slow part of a run)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG of the L6 run here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    path = args.series or trace(GENAI_QPS)
    value_col = None if args.count else (args.value_col or "value")
    y, filled = load_series(path, args.time_col, value_col, args.count, args.step)
    warmup = args.warmup if args.warmup is not None else round(7200 / args.step)
    if len(y) <= warmup + 20:
        raise SystemExit(f"{len(y)} steps: too short for a warm-up of {warmup}")
    config = EngineConfig(horizon=max(12, max(HORIZONS)), window_steps=max(LAGS))
    # the forecaster as it was before the level model (ADR 0025: the combination, the margin learnt
    # only from judged forecasts), same run
    before = dataclasses.replace(config, prefer=None, calibrate=False)
    before_forecasts = None if args.no_before else run_forecaster(y, warmup, before)[0]
    started = time.perf_counter()
    forecasts, used, fits, seeds = run_forecaster(y, warmup, config)
    run_s = time.perf_counter() - started
    result: dict[str, Any] = {
        "series": str(path.name),
        "steps": len(y),
        "filled_steps": filled,
        "warmup_steps": warmup,
        "step_s": args.step,
    }
    sims = {}
    for lag in LAGS:
        sim = Simulation(y, warmup, lag, forecasts, seeds)
        sims[lag] = sim
        figures: dict[str, Any] = {}
        if args.baselines in ("learnt", "both"):
            figures["reactive"] = policy_figures(sim, sim.reactive_learnt, args.q, 1.0)
            figures["hpa"] = policy_figures(sim, sim.hpa_learnt, args.q, 1.0)
        if args.baselines in ("headroom", "both"):
            figures["reactive_headroom"] = policy_figures(sim, sim.reactive, 0.0, 20.0)
            figures["hpa_headroom"] = policy_figures(sim, sim.hpa, 0.0, 20.0)
        figures["tessera"] = policy_figures(sim, sim.tessera, args.q, 1.0)
        result[f"L{lag}"] = figures
        if before_forecasts is not None:
            earlier = Simulation(y, warmup, lag, before_forecasts)
            result[f"L{lag}"]["tessera_combination"] = policy_figures(earlier, earlier.tessera, args.q, 1.0)
    result["accuracy"] = accuracy(y, forecasts, warmup)
    load_before = os.getloadavg()
    wall, cpu = refit_seconds(y, config, args.refit_repeats)
    result["fit_seconds_per_series"] = round(wall, 4)
    result["fit_cpu_seconds_per_series"] = round(cpu, 4)
    result["load_average_during_refit"] = {  # 1, 5 and 15 minutes
        "before": [round(v, 2) for v in load_before],
        "after": [round(v, 2) for v in os.getloadavg()],
    }
    if before_forecasts is not None:
        result["fit_seconds_combination"] = round(refit_seconds(y, before, args.refit_repeats)[0], 4)
    result["serve_p99_ms"] = round(serve_p99_ms(forecasts, 20000), 4)
    counts: dict[str, int] = {}
    for name in used[warmup - 1 :]:
        if name:
            counts[name] = counts.get(name, 0) + 1
    result["models_used"] = dict(sorted(counts.items(), key=lambda kv: -kv[1]))
    result["refits"] = {"count": len(fits), "median_s": round(statistics.median(fits), 4) if fits else None}
    result["run_seconds"] = round(run_s, 1)
    print(f"B4 on {path.name}: {len(y)} steps ({filled} filled), warm-up {warmup}")
    print(f"{'lag':>4} {'policy':>19} {'under%':>8} {'over':>7} {'cost@5%':>8} {'cost@1%':>8}")
    for lag in LAGS:
        for name, p in result[f"L{lag}"].items():
            c5, c1 = p["cost_at_5pct"], p["cost_at_1pct"]
            print(
                f"{lag:>4} {name:>19} {p['under_pct']:>8.2f} {p['over_replicas']:>7.3f} "
                f"{'-' if c5 is None else f'{c5:.3f}':>8} {'-' if c1 is None else f'{c1:.3f}':>8}"
            )
    for h, a in result["accuracy"].items():
        print(
            f"accuracy {h}: MAE {a['mae']:.4f}  WAPE {a['wape']:.4f}  under>10% {a['under_10pct_share']:.3f}"
        )
    print(
        f"refit (one day, one core): {result['fit_seconds_per_series']:.3f} s wall, "
        f"{result['fit_cpu_seconds_per_series']:.3f} s CPU (load average {result['load_average_during_refit']}) "
        f"(combination: {result.get('fit_seconds_combination', '-')} s); "
        f"serve p99 {result['serve_p99_ms']:.4f} ms"
    )
    print(f"models used: {result['models_used']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plot(args.plot, y, forecasts, sims[6], args.q, path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
