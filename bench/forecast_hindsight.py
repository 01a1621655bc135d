"""B4's hindsight bound: how cheap the served forecast could be with a margin known in advance.

    python -m bench.forecast_hindsight --json bench/results/forecast_hindsight.json

The served policy adds one learnt margin to the forecast's window maximum. Here the margin is instead
chosen in hindsight for each block of `--blocks` steps (the origins of a block share it), from a grid
of 0 to 6 replicas' worth, so that the run as a whole is short on at most `--pct`% of its steps with the
fewest over-provisioned replicas. The allocation across blocks is exact over that grid (a knapsack on
the steps short, solved by dynamic programming), so the figure is a lower bound for any margin on the
grid that is constant within each block, however it is predicted. The forecasts are the service's own, replayed as
`bench.forecast` replays them, on the same series and simulation."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench._forecast_series import HORIZONS, add_series_arguments, parse_where, run_forecaster, series_from
from bench._forecast_sim import Simulation
from bench.forecast import ENGINES
from tessera.devcluster.data import GENAI_QPS, trace
from tessera.forecaster.service_layer.engine import EngineConfig

GRID_REPLICAS = 6.0
"""the default largest margin tried, in replicas (--grid-replicas)"""
GRID_STEP = 0.025
"""replicas between two margins tried"""
GRID_POINTS = round(GRID_REPLICAS / GRID_STEP) + 1


def block_table(sim: Simulation, block: int, margins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each block (rows) and margin (columns): the judged steps short and the replicas over that
    the block's origins decide (a step's replicas come from the origin `lag` steps before it)."""
    T, lag = len(sim.y), sim.lag
    t = np.arange(T)
    judged = (t >= sim.warmup) & (t >= lag)
    owner = (t - lag) // block
    blocks = int(owner[judged].max()) + 1 if judged.any() else 0
    short = np.zeros((blocks, len(margins)), dtype=int)
    over = np.zeros((blocks, len(margins)))
    for j, margin in enumerate(margins):
        r = sim._replicas(sim.base + margin)
        is_short = (r < sim.need) & judged
        extra = np.where(judged, np.maximum(r - sim.need, 0), 0.0)
        short[:, j] = np.bincount(owner[judged], weights=is_short[judged], minlength=blocks)
        over[:, j] = np.bincount(owner[judged], weights=extra[judged], minlength=blocks)
    return short, over


def cheapest(short: np.ndarray, over: np.ndarray, allowed: int) -> tuple[int, float]:
    """The fewest replicas over (and the steps short) with one margin per block and at most `allowed`
    steps short in all: exact, by dynamic programming over the steps short."""
    best = np.full(allowed + 1, math.inf)  # best[u]: least over with exactly u steps short so far
    best[0] = 0.0
    for b in range(short.shape[0]):
        nxt = np.full(allowed + 1, math.inf)
        for u_b, o_b in zip(short[b], over[b], strict=True):
            if u_b > allowed:
                continue
            shifted = np.full(allowed + 1, math.inf)
            shifted[u_b:] = best[: allowed + 1 - u_b] + o_b
            np.minimum(nxt, shifted, out=nxt)
        best = nxt
    u = int(np.argmin(best))
    return u, float(best[u])


def hindsight_cost(
    sim: Simulation, block: int, pct: float, grid_replicas: float = GRID_REPLICAS
) -> dict[str, float] | None:
    """Mean replicas over and % of steps short at the bound; None when no margin up to `grid_replicas`
    reaches `pct`."""
    judged = len(sim.y) - max(sim.warmup, sim.lag)
    points = round(grid_replicas / GRID_STEP) + 1
    margins = np.linspace(0.0, (points - 1) * GRID_STEP, points) * sim.capacity
    short, over = block_table(sim, block, margins)
    u, o = cheapest(short, over, math.floor(judged * pct / 100))
    if not math.isfinite(o):
        return None
    return {"under_pct": round(u / judged * 100, 3), "over_replicas": round(o / judged, 3)}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.forecast_hindsight", description=__doc__.split("\n")[0])
    add_series_arguments(p)
    p.add_argument("--warmup", type=int, default=120, help="steps before any is judged (default 120)")
    p.add_argument("--blocks", default="60,120,240", help="block lengths in steps, comma-separated")
    p.add_argument("--lags", default="3,6", help="actuation lags in steps, comma-separated")
    p.add_argument("--pct", type=float, default=5.0, help="share of steps allowed short (default 5)")
    p.add_argument(
        "--engine",
        choices=tuple(ENGINES),
        default="default",
        help="the forecaster replayed (as bench.forecast)",
    )
    p.add_argument(
        "--grid-replicas",
        type=float,
        default=GRID_REPLICAS,
        help=f"largest margin tried, in replicas, in steps of {GRID_STEP} (default {GRID_REPLICAS:g}); "
        "a block that needs more leaves the bound unreachable (null)",
    )
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    parse_where(p, args)
    try:
        args.blocks = [int(v) for v in args.blocks.split(",")]
        args.lags = [int(v) for v in args.lags.split(",")]
    except ValueError:
        p.error("--blocks and --lags take whole numbers of steps, e.g. 60,120")
    if any(v < 1 for v in [*args.blocks, *args.lags]):
        p.error("--blocks and --lags must be at least 1 step")
    if not GRID_STEP <= args.grid_replicas <= 100:
        p.error(f"--grid-replicas must lie in [{GRID_STEP}, 100]")
    args.grid_replicas = round(args.grid_replicas / GRID_STEP) * GRID_STEP  # the largest margin tried
    if not 0 <= args.pct <= 100:
        p.error("--pct must lie in [0, 100]")
    if args.warmup < max(args.lags):
        p.error("--warmup must be at least the largest lag (the steps judged start after both)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    path, y, _ = series_from(args, trace(GENAI_QPS))
    config = EngineConfig(horizon=max(12, max(HORIZONS)), window_steps=max(args.lags), **ENGINES[args.engine])
    print(f"replaying the forecaster on {path.name} ({len(y)} steps) ...", file=sys.stderr)
    forecasts, _, _, seeds = run_forecaster(y, args.warmup, config)
    result: dict[str, Any] = {
        "series": path.name,
        "where": args.where,
        "time_col": args.time_col,
        "value_col": None if args.count else (args.value_col or "value"),
        "count": args.count,
        "step_s": args.step,
        "warmup_steps": args.warmup,
        "engine": args.engine,
        "pct": args.pct,
        "grid_replicas": args.grid_replicas,
    }
    for lag in args.lags:
        sim = Simulation(y, args.warmup, lag, forecasts, seeds)
        for block in args.blocks:
            figures = hindsight_cost(sim, block, args.pct, args.grid_replicas)
            result[f"L{lag}_block{block}"] = figures
            print(f"lag {lag}, margin per {block} steps in hindsight: {figures}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
