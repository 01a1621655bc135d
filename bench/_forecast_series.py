"""B4's series and its forecasts (see ``bench.forecast``): the CSV read onto a regular grid, the
forecaster run over it from every origin, the accuracy of what it forecast, and the refit and serve
timings. ``bench.forecast`` holds the numeric libraries to one thread before it imports this module."""

from __future__ import annotations

import argparse
import gzip
import math
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from tessera.forecaster.adapters.models import default_candidates
from tessera.forecaster.domain.forecast import Forecast, serve
from tessera.forecaster.service_layer.engine import EngineConfig, SeriesForecaster

HORIZONS = (1, 5, 10)


def add_series_arguments(parser: argparse.ArgumentParser) -> None:
    """The options naming the series a forecast bench replays (`series_from` reads them back)."""
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
    value.add_argument(
        "--count", action="store_true", help="each row is one event: a step's value is its number of rows"
    )
    parser.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="COL=VALUE",
        help="keep only rows whose column COL holds VALUE (repeatable), e.g. "
        "'request_type=API Requests' for one request type of the QPS trace",
    )
    parser.add_argument("--step", type=float, default=60.0, help="seconds per step (default 60)")


def parse_where(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`--where COL=VALUE` items into a dict, or the parser's error naming the bad one."""
    where: dict[str, str] = {}
    for item in args.where:
        col, sep, value = item.partition("=")
        if not sep or not col:
            parser.error(f"--where {item!r}: expected COL=VALUE")
        where[col] = value
    args.where = where


def series_from(args: argparse.Namespace, default: Path) -> tuple[Path, np.ndarray, int]:
    """The series the options name (`default` without --series), and how many steps were filled."""
    path: Path = args.series or default
    value_col = None if args.count else (args.value_col or "value")
    y, filled = load_series(path, args.time_col, value_col, args.count, args.step, args.where)
    return path, y, filled


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
    path: Path,
    time_col: str,
    value_col: str | None,
    count: bool,
    step_s: float,
    where: dict[str, str] | None = None,
) -> tuple[np.ndarray, int]:
    """The series on a regular grid of `step_s`, and how many of its steps were filled; with `where`,
    only the rows whose columns hold those values (e.g. one request type of a QPS trace). With `count`,
    each row is one event and a step's value is the number of rows in it (0 where there are none:
    nothing is filled)."""
    opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
    import csv

    windows: dict[float, float] = {}
    with opener(path, "rt", newline="") as f:
        reader = csv.DictReader(f)
        unknown = sorted(set(where or {}) - set(reader.fieldnames or ()))
        if unknown:
            raise SystemExit(
                f"{path}: --where names no column {', '.join(unknown)} (has {reader.fieldnames})"
            )
        for row in reader:
            if where and any(row.get(col) != value for col, value in where.items()):
                continue
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
    if count:  # event rows: a step's value is how many fell in it, and a step with none had none
        steps: dict[int, float] = {}
        for t, n in windows.items():
            k = math.floor(t / step_s)
            steps[k] = steps.get(k, 0.0) + n
        first_step = min(steps)
        counts = np.zeros(max(steps) - first_step + 1)
        for k, n in steps.items():
            counts[k - first_step] = n
        return counts, 0
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
