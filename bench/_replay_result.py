"""The replay benchmark's result (see ``bench.replay``): what the watch saw, summed up and printed."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from bench._replay_stack import PodWatch


@dataclass
class Result:
    pods_requested: int
    created: int
    rejected_on_create: int
    bound: int
    unbound: int
    phases: dict[str, int]
    failure_reasons: dict[str, int]
    replay_seconds: float
    bound_per_s: float
    backlog_bound_per_s: float | None
    create_to_bound_p50_ms: float | None
    create_to_bound_p99_ms: float | None
    max_replay_lag_s: float
    cpu_seconds: dict[str, float]
    cpu_seconds_per_pod: dict[str, float | None] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarise(
    args: argparse.Namespace,
    *,
    trace_size: int,
    report: Any,
    watcher: PodWatch,
    replay_seconds: float,
    cpu: dict[str, float],
) -> Result:
    records = [watcher.pods[n] for n in report.created if n in watcher.pods]
    bound = [r for r in records if r.bound_at is not None and r.created_at is not None]
    latencies = [max(0.0, cast(float, r.bound_at) - cast(float, r.created_at)) * 1000 for r in bound]
    phases: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for r in records:
        phases[r.phase] = phases.get(r.phase, 0) + 1
        if r.phase == "Failed":
            reasons[r.reason or "unknown"] = reasons.get(r.reason or "unknown", 0) + 1
    first = min((cast(float, r.created_at) for r in bound), default=0.0)
    last = max((cast(float, r.bound_at) for r in bound), default=0.0)
    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    return Result(
        pods_requested=trace_size,
        created=len(report.created),
        rejected_on_create=len(report.failed),
        bound=len(bound),
        unbound=len(records) - len(bound),
        phases=dict(sorted(phases.items())),
        failure_reasons=dict(sorted(reasons.items())),
        replay_seconds=round(replay_seconds, 2),
        bound_per_s=round(len(bound) / (last - first), 2) if len(bound) > 1 and last > first else 0.0,
        backlog_bound_per_s=backlog_rate(
            [cast(float, r.created_at) for r in bound], [cast(float, r.bound_at) for r in bound]
        ),
        create_to_bound_p50_ms=round(p50, 1) if p50 is not None else None,
        create_to_bound_p99_ms=round(p99, 1) if p99 is not None else None,
        max_replay_lag_s=round(report.max_lag_s, 3),
        cpu_seconds=cpu,
        cpu_seconds_per_pod=per_pod(cpu, len(report.created)),
        settings={
            "pods": str(args.pods.name),
            "nodes": str(args.nodes.name),
            "skip": args.skip,
            "limit": args.limit,
            "speed": args.speed,
            "rate": args.rate,
            "creators": args.creators,
            "gangs": args.gangs,
            "services": args.services,
            "cpus": os.cpu_count(),
            "command": "python -m bench.replay " + " ".join(sys.argv[1:]),
        },
    )


BACKLOG = 50
"""Pods created and not yet bound above which the scheduler counts as saturated."""


def backlog_rate(created: Sequence[float], bound: Sequence[float], backlog: int = BACKLOG) -> float | None:
    """Pods bound per second while at least ``backlog`` created pods waited: the scheduler's own
    throughput, which ``bound_per_s`` hides when pods are created more slowly than they are bound
    (on a loaded machine the replayer itself can be the limit). None if the backlog never formed."""
    events = sorted([(t, 1) for t in created] + [(t, -1) for t in bound])
    waiting, busy_s, binds, since = 0, 0.0, 0, None
    for t, change in events:
        if since is not None:
            busy_s += t - since
            binds += change < 0
        waiting += change
        since = t if waiting >= backlog else None
    return round(binds / busy_s, 2) if busy_s > 0 and binds else None


def per_pod(cpu: dict[str, float], pods: int) -> dict[str, float | None]:
    """CPU seconds per pod replayed, by process (None where the process was restarted mid-run)."""
    return {
        name: (round(seconds / pods, 5) if pods and seconds == seconds else None)  # NaN: restarted
        for name, seconds in cpu.items()
    }


def print_table(result: Result) -> None:
    rows = [
        ("pods replayed (created / rejected)", f"{result.created} / {result.rejected_on_create}"),
        ("pods bound / never bound", f"{result.bound} / {result.unbound}"),
        ("final phases", ", ".join(f"{k} {v}" for k, v in result.phases.items()) or "-"),
        ("failure reasons", ", ".join(f"{k} {v}" for k, v in result.failure_reasons.items()) or "-"),
        ("replay wall time (s)", f"{result.replay_seconds:.1f}"),
        ("bound pods / s", f"{result.bound_per_s:.2f}"),
        (f"bound pods / s, {BACKLOG}+ waiting", f"{result.backlog_bound_per_s}"),
        ("create -> bound p50 (ms)", f"{result.create_to_bound_p50_ms}"),
        ("create -> bound p99 (ms)", f"{result.create_to_bound_p99_ms}"),
        ("max replay lag (s)", f"{result.max_replay_lag_s:.3f}"),
        *((f"CPU s: {name}", f"{seconds:.1f}") for name, seconds in sorted(result.cpu_seconds.items())),
        *(
            (f"CPU ms per pod: {name}", "-" if seconds is None else f"{seconds * 1000:.1f}")
            for name, seconds in sorted(result.cpu_seconds_per_pod.items())
        ),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"{'metric':<{width}}  value")
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
