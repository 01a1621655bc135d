"""B0 as deployed: the consumer in a process of its own, beside `bench.bus`'s one process.

    python -m bench.bus_topology --messages 3000 --repeat 2 --json bench/results/bus_topology.json

`bench.bus` runs the producers, the relay and the consumer on one event loop, so every stage of an
event waits behind every other stage's work. A deployed Tessera never does that: the relay runs in
the producing service's process and the consumer in the consuming service's (the scheduler's
`pod_bound` is handled by admission, a process of its own). This bench runs the same path both ways,
alternating in one run (ABBA, so a trend in the machine's load favours neither):

- **one process**: `bench.bus`'s path as it is;
- **two processes**: the producers and the relay here, the consumer in `bench._bus_consumer_proc`.

Each is measured flat out, then paced at `--load` of its own flat-out rate. The durability is the
same (the same outbox, relay, consumer and inbox). CPU per message is both processes' together.
Everything else on the machine (NATS, PostgreSQL, other tenants) shares the same cores, so the load
average is recorded."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import nats

from bench._bus_common import (
    RELAY_POLL_S,
    ensure_bench_stream,
    open_rig,
    percentile,
    produce_all,
    register_ping,
    start_servers,
)
from bench.bus import CountingRelay, outbox_path
from tessera.core.observability.metrics import Metrics

REPO = Path(__file__).resolve().parent.parent


async def two_processes(
    nats_url: str, database_url: str, messages: int, producers: int, rate_per_s: float | None = None
) -> dict[str, float]:
    """The path with the consumer in a process of its own: flat out when `rate_per_s` is None."""
    rig = await open_rig(nats_url, database_url, producers)
    await rig.js.purge_stream("TESSERA_BENCH")
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench._bus_consumer_proc",
        "--nats-url",
        nats_url,
        "--database-url",
        database_url,
        "--messages",
        str(messages),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdout is not None
    try:
        ready = await asyncio.wait_for(child.stdout.readline(), timeout=60)
        if ready.strip() != b"ready":
            raise RuntimeError(f"the consumer process did not start: {ready!r}")
        relay = CountingRelay(rig.js, rig.sessions, rig.outbox, Metrics(), rig.stop, poll_s=RELAY_POLL_S)
        rig.tasks.append(asyncio.create_task(relay.run()))
        started, wall_started, cpu_started = time.perf_counter(), time.time(), time.process_time()
        await produce_all(rig, relay, messages, producers, 1, started, rate_per_s)
        report = json.loads(await asyncio.wait_for(child.stdout.readline(), timeout=300))
        producer_cpu_s = time.process_time() - cpu_started
    finally:
        if child.returncode is None:
            try:
                await asyncio.wait_for(child.wait(), timeout=30)
            except TimeoutError:  # it never got its events (the producing side failed): end it
                child.kill()
                await child.wait()
        await rig.close()
    latencies: list[float] = report["latencies_ms"]
    return {
        "e2e_per_s": messages / (report["finished_at"] - wall_started),
        "e2e_p50_ms": statistics.median(latencies),
        "e2e_p99_ms": percentile(latencies, 0.99),
        "handled": len(latencies),
        "cpu_us": (producer_cpu_s + report["cpu_s"]) / messages * 1e6,
        "consumer_cpu_us": report["cpu_s"] / messages * 1e6,
        "rows_per_round": messages / max(1, relay.rounds),
    }


async def one_process(
    nats_url: str, database_url: str, messages: int, producers: int, rate_per_s: float | None = None
) -> dict[str, float]:
    return await outbox_path(nats_url, database_url, messages, producers, rate_per_s)


async def flat_out_then_paced(
    path: Any, nats_url: str, database_url: str, args: argparse.Namespace
) -> dict[str, float]:
    flat_out = await path(nats_url, database_url, args.messages, args.producers)
    rate = flat_out["e2e_per_s"] * args.load
    paced = await path(nats_url, database_url, args.messages, args.producers, rate)
    print(
        f"  flat out {flat_out['e2e_per_s']:.0f}/s ({flat_out['cpu_us']:.0f} us CPU/msg); "
        f"paced at {rate:.0f}/s: p50 {paced['e2e_p50_ms']:.1f} ms, p99 {paced['e2e_p99_ms']:.1f} ms",
        file=sys.stderr,
    )
    return {
        "e2e_per_s": flat_out["e2e_per_s"],
        "e2e_cpu_us_per_msg": flat_out["cpu_us"],
        "saturated_p99_ms": flat_out["e2e_p99_ms"],
        "paced_per_s": rate,
        "e2e_p50_ms": paced["e2e_p50_ms"],
        "e2e_p99_ms": paced["e2e_p99_ms"],
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    register_ping()
    nats_url, database_url, handles = start_servers(args.nats_url, args.database_url)
    load = [round(os.getloadavg()[0], 2)]
    runs: dict[str, list[dict[str, float]]] = {"one_process": [], "two_processes": []}
    paths = {"one_process": one_process, "two_processes": two_processes}
    try:
        nc = await nats.connect(nats_url)
        await ensure_bench_stream(nc.jetstream())
        await nc.close()
        for repetition in range(args.repeat):
            order = ["one_process", "two_processes"]
            for name in order if repetition % 2 == 0 else order[::-1]:
                print(f"[{repetition + 1}] {name.replace('_', ' ')}:", file=sys.stderr)
                runs[name].append(await flat_out_then_paced(paths[name], nats_url, database_url, args))
    finally:
        for handle in handles:
            handle.close()
    load.append(round(os.getloadavg()[0], 2))
    result: dict[str, Any] = {
        name: {key: statistics.median(run[key] for run in done) for key in done[0]}
        for name, done in runs.items()
    }
    result["per_repetition"] = runs
    result["ratio_two_over_one_e2e_per_s"] = [
        b["e2e_per_s"] / a["e2e_per_s"]
        for a, b in zip(runs["one_process"], runs["two_processes"], strict=True)
    ]
    result["ratio_two_over_one_p99"] = [
        b["e2e_p99_ms"] / a["e2e_p99_ms"]
        for a, b in zip(runs["one_process"], runs["two_processes"], strict=True)
    ]
    result.update(
        messages=args.messages,
        producers=args.producers,
        events_per_commit=1,
        latency_at_load=args.load,
        repetitions=args.repeat,
        load_average_1m=load,
    )
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bus_topology",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--messages", type=int, default=3000, help="messages per path (default 3000)")
    parser.add_argument(
        "--producers", type=int, default=8, help="concurrent producing transactions (default 8)"
    )
    parser.add_argument("--repeat", type=int, default=2, help="ABBA repetitions (default 2)")
    parser.add_argument(
        "--load",
        type=float,
        default=0.5,
        help="latency is measured paced at this share of each flat-out rate",
    )
    parser.add_argument("--nats-url", help="an existing NATS with JetStream (default: start an embedded one)")
    parser.add_argument("--database-url", help="an existing PostgreSQL (default: start an embedded one)")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if min(args.messages, args.producers, args.repeat) < 1:
        parser.error("--messages, --producers and --repeat must be at least 1")
    if not 0 < args.load <= 1:
        parser.error("--load must be in (0, 1]")
    result = asyncio.run(run(args))
    for name in ("one_process", "two_processes"):
        figures = result[name]
        print(
            f"{name.replace('_', ' '):<14} flat out {figures['e2e_per_s']:>6.0f}/s "
            f"{figures['e2e_cpu_us_per_msg']:>5.0f} us CPU/msg; paced at {figures['paced_per_s']:.0f}/s "
            f"p50 {figures['e2e_p50_ms']:.1f} ms p99 {figures['e2e_p99_ms']:.1f} ms"
        )
    print(f"load average (1 min) at start and end: {result['load_average_1m']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
