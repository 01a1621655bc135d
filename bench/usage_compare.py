"""Before and after in one run: `bench.usage` on an earlier commit, then on the working tree, repeated.

The machine is shared, so readings per CPU-second move with its load; what one run of this module
reports is the ratio of the two measured back to back, alternating (before, after, before, ...). The
earlier commit is checked out in a temporary git worktree and run with its own sources first on the
import path (the same interpreter and dependencies), so each side measures its own ingest code.

    python -m bench.usage_compare --before 6b1184d --reps 3 --json bench/results/usage_before_after.json

Every run replays the whole trace (about a minute each on 2 vCPUs) on its own embedded PostgreSQL,
unless --database-url names a server.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ("samples_per_s", "cpu_s", "domain_cpu_s", "flush_cpu_s", "db_server_cpu_s", "error_pct")


def source_path(tree: Path) -> str:
    """The tree itself (for `bench`) and every workspace member's `src`, for PYTHONPATH."""
    members = sorted(tree.glob("libs/*/src")) + sorted(tree.glob("services/*/src"))
    return os.pathsep.join([str(tree), *(str(m) for m in members)])


def run_usage(tree: Path, extra: list[str]) -> dict[str, Any]:
    """`python -m bench.usage` of `tree`, its figures parsed from what it prints."""
    env = {**os.environ, "PYTHONPATH": source_path(tree)}
    done = subprocess.run(
        [sys.executable, "-m", "bench.usage", *extra],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode not in (0, 1):  # 1: a goal missed, the figures are still printed
        raise RuntimeError(f"bench.usage in {tree} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in FIGURES:
        values = [r[name] for r in runs if r.get(name) is not None]
        out[name] = {"runs": values, "median": statistics.median(values) if values else None}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.usage_compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--before", required=True, help="the earlier commit (any git revision)")
    parser.add_argument("--reps", type=int, default=3, help="before/after pairs, alternating (default: 3)")
    parser.add_argument("--hours", type=float, default=None, help="replay only the first hours")
    parser.add_argument("--database-url", default=None, help="an existing PostgreSQL server")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    extra = [*(["--hours", str(args.hours)] if args.hours else [])]
    extra += ["--database-url", args.database_url] if args.database_url else []
    revision = subprocess.run(
        ["git", "rev-parse", "--short", args.before], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if revision.returncode != 0:
        parser.error(f"--before: {args.before!r} is not a revision of this repository")
    with tempfile.TemporaryDirectory(prefix="tessera-usage-before-") as scratch:
        before_tree = Path(scratch) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(before_tree), args.before], cwd=ROOT, check=True
        )
        try:
            runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
            for rep in range(1, args.reps + 1):
                for side, tree in (("before", before_tree), ("after", ROOT)):
                    print(f"[{rep}/{args.reps}] {side} ...", file=sys.stderr, flush=True)
                    runs[side].append(run_usage(tree, extra))
                    print(f"  {runs[side][-1]['samples_per_s']} readings/s", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before_tree)], cwd=ROOT, check=False)
    before, after = summary(runs["before"]), summary(runs["after"])
    ratio = {
        name: round(after[name]["median"] / before[name]["median"], 3)
        for name in ("samples_per_s", "domain_cpu_s", "flush_cpu_s", "db_server_cpu_s")
        if before[name]["median"] and after[name]["median"]
    }
    result = {
        "before": {"revision": revision.stdout.strip(), **before},
        "after": {"revision": "working tree", **after},
        "after_over_before_medians": ratio,
        "reps": args.reps,
        "hours": args.hours,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
