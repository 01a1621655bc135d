"""Before and after in one run: `bench.replay` with settings of the old path, then of the new, repeated.

The machine is shared, so absolute pods/s move with its load; what one run of this module reports
is the ratio of the two paths measured back to back, alternating (before, after, before, after,
...), each replay on a stack of its own with the same command and the same commit. A path is a set
of the services' environment variables (settings): by default the old path is
``TESSERA_SCHEDULER_PIPELINED_BINDS=false`` (bind the decided gangs together and wait, before
deciding more) and ``TESSERA_SCHEDULER_KUBE_CONNECTIONS=10`` (the Kubernetes client's own pool on two
CPUs), the new one the defaults (ADR 0026).

Run ``python -m bench.replay_compare --limit 3000 --speed 1e6 --reps 2 --json PATH``; every option
of ``python -m bench.replay`` applies to both paths.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from bench import replay

OLD_PATH = "TESSERA_SCHEDULER_PIPELINED_BINDS=false,TESSERA_SCHEDULER_KUBE_CONNECTIONS=10"
FIGURES = ("bound_per_s", "backlog_bound_per_s", "create_to_bound_p50_ms", "create_to_bound_p99_ms")


def build_parser() -> argparse.ArgumentParser:
    parser = replay.build_parser()
    parser.prog = "python -m bench.replay_compare"
    parser.description = __doc__.split("\n\n")[0]
    parser.add_argument(
        "--before", default=OLD_PATH, help="NAME=VALUE,... of the old path (default: %(default)s)"
    )
    parser.add_argument("--after", default="", help="NAME=VALUE,... of the new path (default: none)")
    parser.add_argument("--reps", type=int, default=1, help="before/after pairs, alternating (default: 1)")
    return parser


def environment(assignments: str) -> dict[str, str]:
    """``A=1,B=2`` as a dict; empty for ``""``."""
    pairs = [item.split("=", 1) for item in assignments.split(",") if item.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"expected NAME=VALUE,...: {assignments!r}")
    return {name.strip(): value.strip() for name, value in pairs}


def cpu_ms(result: replay.Result, process: str) -> float | None:
    seconds = result.cpu_seconds_per_pod.get(process)
    return None if seconds is None else round(seconds * 1000, 2)


def figures(result: replay.Result) -> dict[str, Any]:
    return {
        **{name: getattr(result, name) for name in FIGURES},
        "scheduler_cpu_ms_per_pod": cpu_ms(result, "scheduler"),
        "devcluster_cpu_ms_per_pod": cpu_ms(result, "devcluster"),
        "bound": result.bound,
        "created": result.created,
        "replay_seconds": result.replay_seconds,
    }


def ratio(after: float | None, before: float | None) -> float | None:
    return round(after / before, 3) if after is not None and before else None


def summary(pairs: list[tuple[replay.Result, replay.Result]]) -> dict[str, Any]:
    """Medians of each path, and each pair's after / before."""
    keys = (*FIGURES, "scheduler_cpu_ms_per_pod", "devcluster_cpu_ms_per_pod")
    out: dict[str, Any] = {}
    for side, index in (("before", 0), ("after", 1)):
        rows = [figures(pair[index]) for pair in pairs]
        out[side] = {
            key: statistics.median(values)
            if (values := [r[key] for r in rows if r[key] is not None])
            else None
            for key in keys
        }
    out["after_over_before_per_pair"] = {
        key: [ratio(figures(a)[key], figures(b)[key]) for b, a in pairs] for key in keys
    }
    out["after_over_before"] = {key: ratio(out["after"][key], out["before"][key]) for key in keys}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        paths = {"before": environment(args.before), "after": environment(args.after)}
    except ValueError as exc:
        print(f"--before/--after: {exc}", file=sys.stderr)
        return 2
    if args.reps < 1:
        print("--reps must be >= 1", file=sys.stderr)
        return 2
    pairs: list[tuple[replay.Result, replay.Result]] = []
    for rep in range(args.reps):
        done = []
        for side, env in paths.items():
            print(f"-- pair {rep + 1}/{args.reps}: {side} {env or '(defaults)'}", flush=True)
            result = replay.run(args, env)
            result.settings["environment"] = env
            replay.print_table(result)
            done.append(result)
        pairs.append((done[0], done[1]))
    report = {
        "before_environment": paths["before"],
        "after_environment": paths["after"],
        "command": "python -m bench.replay_compare " + " ".join(sys.argv[1:] if argv is None else argv),
        **summary(pairs),
        "runs": [{"before": asdict(b), "after": asdict(a)} for b, a in pairs],
    }
    print(json.dumps({k: report[k] for k in ("before", "after", "after_over_before")}, indent=2))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    complete = all(r.bound == r.created and r.created > 0 for pair in pairs for r in pair)
    return 0 if complete else 1


if __name__ == "__main__":
    raise SystemExit(main())
