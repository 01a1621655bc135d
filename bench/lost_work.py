"""B6 addendum — lost work: GPU-hours thrown away when jobs are preempted or lose their spot node.

    python -m bench.lost_work --json bench/results/lost_work.json

A seeded simulation over the gang benchmark's workload (`bench.gang.generate_jobs`: 2-16 pods x 1-8
GPUs, log-normal durations with a median of one hour). Of every seed's jobs, 5% are interrupted at a
time drawn uniformly over their run: half of them preempted (admission's checkpoint grace as the notice),
half on a spot node that is reclaimed (the cloud's notice). Queueing does not change what an
interruption loses, so jobs are not scheduled here: each interrupted job has run `t` seconds when it is
interrupted, on all its GPUs. Three ways to go:

- evict at the deadline, no checkpoints: everything since the start is lost (`t`);
- periodic checkpoints only (every `--interval`), evicted at the deadline: the work since the last
  periodic checkpoint that was durable (its snapshot `stall_s` plus its flush `flush_s` done) is lost;
- checkpoint first (Tessera): periodic checkpoints, and a save on the notice: the job is evicted once
  that checkpoint is durable, so it loses the stall and the flush (it trains on while flushing, and those
  steps are thrown away); a notice shorter than stall + flush falls back to the last periodic checkpoint.

The stall, flush and restore times are B6's measurements (`bench/results/checkpoint.json`, CPU path) for
the state size each GPU saves (`--state`, one of the measured sizes). Restoring costs the same
`restore_s` in both strategies that restore (reported apart, not as lost work); the periodic checkpoints'
stall on every job, interrupted or not, is reported against a synchronous save of the same state.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.gang import HOUR, Job, generate_jobs

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_JSON = RESULTS / "lost_work.json"
DEFAULT_MEASURED = RESULTS / "checkpoint.json"
STRATEGIES = ("evict_at_deadline", "periodic_only", "checkpoint_first")
LABELS = {
    "evict_at_deadline": "evict at the deadline, no checkpoints",
    "periodic_only": "periodic checkpoints only",
    "checkpoint_first": "checkpoint first (periodic + save on notice)",
}


@dataclass(frozen=True)
class Costs:
    """What one checkpoint costs a GPU's training loop, as B6 measured it for one state size."""

    state: str
    state_bytes: int
    stall_s: float
    flush_s: float
    restore_s: float
    sync_save_s: float

    @property
    def save_s(self) -> float:
        """From the snapshot to a durable checkpoint."""
        return self.stall_s + self.flush_s


def measured_costs(path: Path, state: str) -> Costs:
    figures = json.loads(path.read_text())["cpu"]
    if state not in figures:
        raise SystemExit(f"--state: {path} measured {', '.join(figures)}, not {state}")
    f = figures[state]
    flush_s = f["bytes"] / (f["flush_gbps"] * 1e9)
    return Costs(state, int(f["bytes"]), f["stall_s"], flush_s, f["restore_s"], f["sync_save_s"])


@dataclass(frozen=True)
class Interruption:
    job: str
    gpus: int
    duration_s: float
    at_s: float  # how long the job had run
    cause: str  # preemption | spot
    notice_s: float


def interruptions(
    jobs: Sequence[Job], rng: random.Random, fraction: float, preempt_notice_s: float, spot_notice_s: float
) -> list[Interruption]:
    """`fraction` of the jobs, each interrupted once at a uniform time of its run, half by preemption."""
    chosen = rng.sample(list(jobs), round(fraction * len(jobs)))
    out = []
    for job in sorted(chosen, key=lambda j: j.name):
        spot = rng.random() < 0.5
        out.append(
            Interruption(
                job.name,
                job.gpus,
                job.duration,
                rng.uniform(0.0, job.duration),
                "spot" if spot else "preemption",
                spot_notice_s if spot else preempt_notice_s,
            )
        )
    return out


def last_durable_periodic(at_s: float, interval_s: float, costs: Costs) -> float:
    """When the newest periodic checkpoint durable by `at_s` was taken (0: none, the job's start)."""
    taken = (at_s // interval_s) * interval_s
    if taken > 0 and at_s < taken + costs.save_s:
        taken -= interval_s  # the newest one was still flushing: the one before counts
    return max(taken, 0.0)


def lost_seconds(strategy: str, i: Interruption, interval_s: float, costs: Costs) -> float:
    """Seconds of the job's (all-GPU) work thrown away."""
    if strategy == "evict_at_deadline":
        return i.at_s
    periodic = i.at_s - last_durable_periodic(i.at_s, interval_s, costs)
    if strategy == "periodic_only" or i.notice_s < costs.save_s:
        return periodic
    return min(costs.save_s, periodic)  # a periodic checkpoint just made may be newer than the flush


@dataclass
class Figures:
    strategy: str
    interval_s: float
    interrupted: int = 0
    lost_gpu_h: float = 0.0
    lost_gpu_h_per_interrupted_job: float = 0.0
    lost_share_of_interrupted_work: float = 0.0
    """Lost GPU-hours over the GPU-hours the interrupted jobs had run when interrupted."""
    restore_gpu_h: float = 0.0
    fallbacks: int = 0
    """Checkpoint first: notices too short to save (the periodic checkpoint was used)."""


def evaluate(strategy: str, events: Sequence[Interruption], interval_s: float, costs: Costs) -> Figures:
    figures = Figures(strategy, interval_s, len(events))
    run_gpu_h = sum(i.gpus * i.at_s for i in events) / HOUR
    for i in events:
        figures.lost_gpu_h += i.gpus * lost_seconds(strategy, i, interval_s, costs) / HOUR
        saved_on_notice = strategy == "checkpoint_first" and i.notice_s >= costs.save_s
        has_periodic = (
            strategy != "evict_at_deadline" and last_durable_periodic(i.at_s, interval_s, costs) > 0
        )
        if saved_on_notice or has_periodic:  # there is a checkpoint to restore
            figures.restore_gpu_h += i.gpus * costs.restore_s / HOUR
        if strategy == "checkpoint_first" and not saved_on_notice:
            figures.fallbacks += 1
    if events:
        figures.lost_gpu_h_per_interrupted_job = figures.lost_gpu_h / len(events)
    figures.lost_share_of_interrupted_work = figures.lost_gpu_h / run_gpu_h if run_gpu_h else 0.0
    return figures


def periodic_overhead_gpu_h(jobs: Sequence[Job], interval_s: float, seconds_per_save: float) -> float:
    """GPU-hours every job spends blocked in its periodic checkpoints."""
    return sum(job.gpus * int(job.duration // interval_s) * seconds_per_save for job in jobs) / HOUR


def run_seed(args: argparse.Namespace, seed: int, costs: Costs) -> dict[str, Any]:
    jobs, _ = generate_jobs(seed, args.jobs, args.nodes * args.gpus_per_node, args.load)
    events = interruptions(
        jobs, random.Random(seed * 7919 + 1), args.fraction, args.preempt_notice, args.spot_notice
    )
    by_interval: dict[str, dict[str, Any]] = {}
    for interval in args.intervals:
        by_interval[str(int(interval))] = {
            "strategies": {s: asdict(evaluate(s, events, interval, costs)) for s in STRATEGIES},
            "periodic_stall_gpu_h": periodic_overhead_gpu_h(jobs, interval, costs.stall_s),
            "periodic_sync_save_gpu_h": periodic_overhead_gpu_h(jobs, interval, costs.sync_save_s),
        }
    return {
        "jobs": len(jobs),
        "gpu_hours": sum(j.gpus * j.duration for j in jobs) / HOUR,
        "interrupted": len(events),
        "preempted": sum(i.cause == "preemption" for i in events),
        "spot": sum(i.cause == "spot" for i in events),
        "interrupted_run_gpu_h": sum(i.gpus * i.at_s for i in events) / HOUR,
        "by_interval": by_interval,
    }


def mean_over(per_seed: dict[int, dict[str, Any]], interval: str) -> dict[str, Any]:
    runs = [r["by_interval"][interval] for r in per_seed.values()]
    out: dict[str, Any] = {"strategies": {}}
    for s in STRATEGIES:
        rows = [r["strategies"][s] for r in runs]
        out["strategies"][s] = {
            key: statistics.fmean(float(row[key]) for row in rows)
            for key in rows[0]
            if key not in ("strategy", "interval_s")
        }
    for key in ("periodic_stall_gpu_h", "periodic_sync_save_gpu_h"):
        out[key] = statistics.fmean(r[key] for r in runs)
    return out


def render(mean: dict[str, Any], interval: str, seeds: int, interrupted: float, workload_gpu_h: float) -> str:
    header = (
        f"{'strategy (periodic every ' + _duration(float(interval)) + ')':<48}  {'lost GPU-h':>10}  "
        f"{'per job':>8}  {'of run':>7}  {'restore GPU-h':>13}"
    )
    lines = [header, "-" * len(header)]
    for s in STRATEGIES:
        row = mean["strategies"][s]
        lines.append(
            f"{LABELS[s]:<48}  {row['lost_gpu_h']:>10,.1f}  {row['lost_gpu_h_per_interrupted_job']:>8.2f}  "
            f"{row['lost_share_of_interrupted_work']:>7.1%}  {row['restore_gpu_h']:>13.2f}"
        )
    lines.append(
        f"periodic checkpoints' stall on all jobs: {mean['periodic_stall_gpu_h']:.2f} GPU-h "
        f"(a synchronous save: {mean['periodic_sync_save_gpu_h']:.2f} GPU-h); "
        f"mean of {seeds} seeds of {workload_gpu_h:,.0f} GPU-h, {interrupted:.1f} interrupted jobs each"
    )
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds < HOUR else f"{seconds / HOUR:g} h"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.lost_work",
        description=(
            "B6 addendum: GPU-hours of work lost when 5%% of the gang benchmark's jobs are preempted or lose "
            "their spot node, evicting at the deadline against checkpointing first."
        ),
    )
    parser.add_argument("--seed", type=int, default=42, help="first random seed (default 42)")
    parser.add_argument("--seeds", type=int, default=20, help="seeds to run and average (default 20)")
    parser.add_argument("--jobs", type=int, default=300, help="jobs per seed, as bench.gang (default 300)")
    parser.add_argument("--nodes", type=int, default=64, help="nodes, sizing the arrival window (default 64)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument("--load", type=float, default=1.5, help="as bench.gang (default 1.5)")
    parser.add_argument(
        "--fraction", type=float, default=0.05, help="share of jobs interrupted (default 0.05)"
    )
    parser.add_argument(
        "--intervals",
        type=lambda text: [float(v) for v in text.split(",")],
        default=[600.0, 1800.0, 3600.0],
        help="periodic checkpoint intervals in seconds, comma-separated; the first is the headline (600,1800,3600)",
    )
    parser.add_argument(
        "--preempt-notice",
        type=float,
        default=120.0,
        help="a preemption's grace: admission's checkpoint_grace_s (120)",
    )
    parser.add_argument(
        "--spot-notice", type=float, default=120.0, help="a spot reclaim's notice: AWS's two minutes (120)"
    )
    parser.add_argument(
        "--state", default="4GiB", help="the per-GPU state size, one B6 measured (default 4GiB)"
    )
    parser.add_argument(
        "--measured", type=Path, default=DEFAULT_MEASURED, help=f"B6's results ({DEFAULT_MEASURED})"
    )
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, help=f"where to write results ({DEFAULT_JSON})"
    )
    args = parser.parse_args(argv)
    if not 0 < args.fraction <= 1:
        parser.error(f"--fraction: must be in (0, 1], got {args.fraction}")
    if args.seeds < 1 or args.jobs < 1:
        parser.error("--seeds and --jobs: must be >= 1")
    if any(i <= 0 for i in args.intervals):
        parser.error("--intervals: must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    costs = measured_costs(args.measured, args.state)
    print(
        f"B6 measured for {costs.state} per GPU: stall {costs.stall_s:.2f} s, flush {costs.flush_s:.2f} s, "
        f"restore {costs.restore_s:.2f} s, synchronous save {costs.sync_save_s:.2f} s"
    )
    seeds = range(args.seed, args.seed + args.seeds)
    per_seed = {seed: run_seed(args, seed, costs) for seed in seeds}
    intervals = [str(int(i)) for i in args.intervals]
    mean = {interval: mean_over(per_seed, interval) for interval in intervals}
    interrupted = statistics.fmean(r["interrupted"] for r in per_seed.values())
    workload_gpu_h = statistics.fmean(r["gpu_hours"] for r in per_seed.values())
    for interval in intervals:
        print(render(mean[interval], interval, args.seeds, interrupted, workload_gpu_h))
        print()
    payload = {
        "benchmark": "B6 addendum: lost work on preemption and spot loss",
        "command": "python -m bench.lost_work " + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": {
            "seeds": list(seeds),
            "jobs": args.jobs,
            "nodes": args.nodes,
            "gpus_per_node": args.gpus_per_node,
            "load": args.load,
            "fraction": args.fraction,
            "intervals_s": args.intervals,
            "preempt_notice_s": args.preempt_notice,
            "spot_notice_s": args.spot_notice,
        },
        "measured": {**asdict(costs), "save_s": costs.save_s, "from": str(args.measured.name)},
        "mean": mean,
        "per_seed": per_seed,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
