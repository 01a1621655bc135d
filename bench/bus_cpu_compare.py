"""CPU per event of the bus, two source trees against each other in one run.

    python -m bench.bus_cpu_compare --base /tmp/base-tree --messages 4000 --repeat 3 \\
        --json bench/results/bus_cpu_compare.json

`--base` is a checkout of another commit (`git worktree add /tmp/base-tree <commit>`). Each side runs
in a process of its own against the same NATS and PostgreSQL (started once, embedded unless URLs are
given): the base side with the base tree's `libs/core/src` and `libs/contracts/src` first on
`PYTHONPATH` (each child reports where `tessera.core` came from, and the run stops when a side did
not get its own), the new side with this tree's. The bench's own code is this tree's on both sides.
A child runs the relay and the consumer alone on a committed backlog (`bench.bus`'s split), then,
unless `--no-flat-out`, the whole path flat out; the sides alternate, ABBA, `--repeat` times, and
the JSON holds every run, the medians and the new / base ratios per repetition."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import nats

from bench._bus_common import ensure_bench_stream, start_servers

ROOT = Path(__file__).resolve().parent.parent
#: the source trees a side takes from the tree it runs: what the bus is made of
SOURCES = ("libs/core/src", "libs/contracts/src")
FIGURES = ("bus_per_s", "bus_cpu_us", "e2e_per_s", "e2e_cpu_us")


async def child(args: argparse.Namespace) -> dict[str, Any]:
    """One side's figures, in this process (started by :func:`run_side`)."""
    import tessera.core
    from bench._bus_common import register_ping
    from bench.bus import outbox_path

    register_ping()
    common = {"events_per_commit": args.events_per_commit}
    split = await outbox_path(
        args.nats_url, args.database_url, args.messages, args.producers, backlog=True, **common
    )
    result: dict[str, Any] = {
        "tessera_core": tessera.core.__file__,
        "bus_per_s": split["bus_per_s"],
        "bus_cpu_us": split["bus_cpu_us"],
    }
    if args.flat_out:
        flat = await outbox_path(args.nats_url, args.database_url, args.messages, args.producers, **common)
        result.update(e2e_per_s=flat["e2e_per_s"], e2e_cpu_us=flat["cpu_us"])
    return result


def run_side(tree: Path | None, urls: tuple[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """Run one side in a fresh process: `tree`'s sources first on the path (None: this tree's)."""
    paths = [str(tree / source) for source in SOURCES] if tree is not None else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(ROOT)])}
    command = [
        sys.executable,
        "-m",
        "bench.bus_cpu_compare",
        "--child",
        f"--nats-url={urls[0]}",
        f"--database-url={urls[1]}",
        f"--messages={args.messages}",
        f"--producers={args.producers}",
        f"--events-per-commit={args.events_per_commit}",
        "--flat-out" if args.flat_out else "--no-flat-out",
    ]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"a side failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    expected = (tree or ROOT).resolve()
    if not Path(result["tessera_core"]).resolve().is_relative_to(expected):
        raise RuntimeError(f"the side of {expected} imported tessera.core from {result['tessera_core']}")
    return result


def compare(args: argparse.Namespace) -> dict[str, Any]:
    nats_url, database_url, handles = start_servers(args.nats_url, args.database_url)
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "new": []}
    loads: list[float] = [round(os.getloadavg()[0], 2)]
    try:

        async def prepare() -> None:
            nc = await nats.connect(nats_url)
            await ensure_bench_stream(nc.jetstream())
            await nc.close()

        asyncio.run(prepare())
        for repetition in range(args.repeat):
            order = ["base", "new"] if repetition % 2 == 0 else ["new", "base"]
            for side in order:
                tree = args.base if side == "base" else None
                result = run_side(tree, (nats_url, database_url), args)
                runs[side].append(result)
                shown = ", ".join(f"{k} {result[k]:.0f}" for k in FIGURES if k in result)
                print(f"[{repetition + 1}] {side}: {shown}", file=sys.stderr)
                loads.append(round(os.getloadavg()[0], 2))
    finally:
        for handle in handles:
            handle.close()
    figures = [k for k in FIGURES if k in runs["new"][0]]
    return {
        "base_tree": str(args.base),
        "messages": args.messages,
        "producers": args.producers,
        "events_per_commit": args.events_per_commit,
        "repetitions": args.repeat,
        "order": "ABBA (base first in even repetitions)",
        "load_average_1m": loads,
        "base": {k: statistics.median(r[k] for r in runs["base"]) for k in figures},
        "new": {k: statistics.median(r[k] for r in runs["new"]) for k in figures},
        "ratio_new_over_base": {
            k: [n[k] / b[k] for n, b in zip(runs["new"], runs["base"], strict=True)] for k in figures
        },
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bus_cpu_compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--base", type=Path, help="the base tree (a worktree of another commit)")
    parser.add_argument("--messages", type=int, default=4000, help="messages per path (default 4000)")
    parser.add_argument("--producers", type=int, default=8, help="producing transactions (default 8)")
    parser.add_argument(
        "--events-per-commit", type=int, default=1, help="events per producer commit (default 1)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="repetitions, each side once (default 3)")
    parser.add_argument(
        "--flat-out",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the whole path flat out (default)",
    )
    parser.add_argument("--nats-url", help="an existing NATS with JetStream (default: an embedded one)")
    parser.add_argument("--database-url", help="an existing PostgreSQL (default: an embedded one)")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.messages, args.producers, args.events_per_commit, args.repeat) < 1:
        parser.error("--messages, --producers, --events-per-commit and --repeat must be at least 1")
    if args.child:
        print(json.dumps(asyncio.run(child(args))))
        return
    if args.base is None or not (args.base / SOURCES[0]).is_dir():
        parser.error("--base must name a tree with libs/core/src")
    result = compare(args)
    for key in result["new"]:
        ratios = ", ".join(f"{r:.2f}" for r in result["ratio_new_over_base"][key])
        print(f"{key:<12} base {result['base'][key]:>8.0f}  new {result['new'][key]:>8.0f}  ({ratios})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
