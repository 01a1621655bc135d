"""B4 — forecast-driven scaling on a real load series (BENCHMARKS.md, B4).

    python -m bench.forecast --json bench/results/forecast.json --plot bench/results/forecast.png
    python -m bench.forecast --series pod_gpu_duty_cycle.csv.gz --time-col timestamp_anon \\
        --value-col value --json bench/results/forecast_duty_cycle.json

Input: a CSV (optionally gzipped) of readings. Rows with the same `--time-col` value form a window, and
a window's value is the sum of `--value-col` over its rows. The series is the mean over each `--step`
of its windows' values; steps with no window are filled by linear interpolation (their count is
reported). With `--count`, each row is one event (a request, a pod created) and a step's value is the
number of rows in it; a step with none is 0. `--where COL=VALUE` keeps only matching rows. Default:
the GenAI gateway QPS trace shipped in the repo.

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
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from bench._forecast_series import (  # noqa: E402
    HORIZONS,
    accuracy,
    add_series_arguments,
    load_series,
    parse_time,
    parse_where,
    refit_seconds,
    run_forecaster,
    series_from,
    serve_p99_ms,
)
from bench._forecast_sim import HPA_WINDOW, PEAK_REPLICAS, Simulation, plot, policy_figures  # noqa: E402
from tessera.devcluster.data import GENAI_QPS, trace  # noqa: E402
from tessera.forecaster.service_layer.engine import EngineConfig  # noqa: E402

__all__ = [
    "ENGINES",
    "HORIZONS",
    "HPA_WINDOW",
    "LAGS",
    "PEAK_REPLICAS",
    "RESULTS",
    "Simulation",
    "accuracy",
    "load_series",
    "main",
    "parse_args",
    "parse_time",
    "plot",
    "policy_figures",
    "refit_seconds",
    "run_forecaster",
    "serve_p99_ms",
]

RESULTS = Path(__file__).parent / "results"
LAGS = (3, 6)
#: EngineConfig overrides for --engine
ENGINES: dict[str, dict[str, Any]] = {
    "default": {},
    "level": {"prefer": "level", "blend": False},
    "level-cusum": {"prefer": "level-cusum", "blend": False},
    "level-cusum-blend": {"prefer": "level-cusum", "blend": True},
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_series_arguments(parser)
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
    parser.add_argument(
        "--engine",
        choices=tuple(ENGINES),
        default="default",
        help="the forecaster replayed as tessera: as the service is configured by default (the level "
        "blended with the last value, ADR 0031), the level alone (level, ADR 0029), or with the "
        "CUSUM-reset level served (level-cusum) and blended (level-cusum-blend, ADR 0030)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG of the L6 run here")
    args = parser.parse_args(argv)
    parse_where(parser, args)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    path, y, filled = series_from(args, trace(GENAI_QPS))
    warmup = args.warmup if args.warmup is not None else round(7200 / args.step)
    if len(y) <= warmup + 20:
        raise SystemExit(f"{len(y)} steps: too short for a warm-up of {warmup}")
    config = EngineConfig(horizon=max(12, max(HORIZONS)), window_steps=max(LAGS), **ENGINES[args.engine])
    # the forecaster as it was before the level model (ADR 0025: the combination, the margin learnt
    # only from judged forecasts), same run
    before = dataclasses.replace(config, prefer=None, calibrate=False, blend=False)
    before_forecasts = None if args.no_before else run_forecaster(y, warmup, before)[0]
    started = time.perf_counter()
    forecasts, used, fits, seeds = run_forecaster(y, warmup, config)
    run_s = time.perf_counter() - started
    result: dict[str, Any] = {
        "series": str(path.name),
        "where": args.where,
        "engine": args.engine,
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
