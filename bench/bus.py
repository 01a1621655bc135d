"""B0 — the message bus: raw JetStream publish rate beside the outbox -> relay -> consumer path.

    python -m bench.bus --messages 5000 --json bench/results/bus.json

Both run in one process against the same NATS and PostgreSQL (embedded ones unless --nats-url and
--database-url are given), so their ratio is what the transactional outbox and the idempotent
consumer cost over a bare publish. Besides the path flat out (producers, relay and consumer at once)
and its latency paced at a share of that rate, two figures split it: the producers alone (each
transaction commits one event; the relay is off) and the bus alone (relay and consumer carrying a
backlog the producers committed beforehand). CPU is this process's, in microseconds per message.

Each producer transaction commits one event unless `--events-per-commit` says more (a scheduler cycle
or a batch handler records several events in one transaction); durability is the same either way:
every event is committed before it is published and handled once. `--baseline-linger-ms` runs the
flat-out and paced paths also with the relay lingering that long after a wake (0: the relay as it
was before it lingered), alternating with the default `--repeat` times (ABBA order), for a before/after
ratio taken in one run. `--baseline-fetch` does the same with the consumer's former fetch (a pull
for one message, then a second pull lingering 10 ms for the rest of the batch; `bench.bus_baseline`).
`--baseline-consumer` does the same with the consumer as it was before a batch
could go without savepoints (`bench.bus_baseline`: a `SAVEPOINT` and a `RELEASE` per message), and
then runs the split (producers alone, relay and consumer alone) on each side too.

The bench's consumer is declared `replay_safe`, as the scheduler's are (`--no-replay-safe`: a savepoint
per message after a batch's first): its handler only records a latency, and no handler fails here, so
no batch is ever run twice. Its handler sends no statement unless `--handler-statements` says how
many; SQLAlchemy sends a savepoint only with a statement inside it, so the savepoints' round trips
show only then."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
from sqlalchemy import text

from bench._bus_common import (
    RELAY_POLL_S,
    SERVICE,
    Ping,
    ensure_bench_stream,
    open_rig,
    percentile,
    ping_consumer,
    produce_all,
    register_ping,
    start_servers,
)
from bench._bus_report import print_table
from bench.bus_baseline import LingeringFetchRunner, SavepointPerMessageRunner
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.consumer import ConsumerRunner
from tessera.core.messaging.envelope import Envelope
from tessera.core.messaging.outbox import OutboxRelay
from tessera.core.observability.metrics import Metrics

SELECT_1 = text("SELECT 1")
RESULTS = Path(__file__).parent / "results"


class CountingRelay(OutboxRelay):
    """The relay, counting its rounds that published something: rows per round is how well it
    batches, a figure the machine's load does not blur the way it blurs rates."""

    rounds = 0

    async def publish_batch_outcomes(self) -> tuple[int, int]:
        published, failed = await super().publish_batch_outcomes()
        self.rounds += 1 if published else 0
        return published, failed


async def raw_publish_rate(nats_url: str, messages: int, window: int) -> float:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    body = b'{"n": 0}'
    started = time.perf_counter()
    for first in range(0, messages, window):
        await asyncio.gather(
            *(
                js.publish("tessera.bench.raw", body, headers={"Nats-Msg-Id": f"raw-{first + i}"})
                for i in range(min(window, messages - first))
            )
        )
    elapsed = time.perf_counter() - started
    await nc.close()
    return messages / elapsed


async def outbox_path(
    nats_url: str,
    database_url: str,
    messages: int,
    producers: int,
    rate_per_s: float | None = None,
    *,
    backlog: bool = False,
    events_per_commit: int = 1,
    linger_s: float | None = None,
    runner: type[ConsumerRunner[UnitOfWork]] = ConsumerRunner,
    replay_safe: bool = True,
    handler_statements: int = 0,
) -> dict[str, float]:
    """Flat out when `rate_per_s` is None (throughput), else paced at that rate (latency). With
    `backlog`, the producers commit every message first (timed alone), then the relay and the
    consumer carry them (timed alone)."""
    rig = await open_rig(nats_url, database_url, producers)
    await rig.js.purge_stream("TESSERA_BENCH")  # each run consumes only its own messages
    metrics = Metrics()
    latencies: list[float] = []
    done = asyncio.Event()

    async def handle(envelope: Envelope, uow: UnitOfWork) -> None:
        ping = envelope.parse()
        assert isinstance(ping, Ping)
        for _ in range(handler_statements):  # as a service's handler reads and writes its tables
            await uow.session.execute(SELECT_1)
        latencies.append((datetime.now(UTC) - ping.sent_at).total_seconds() * 1000)
        if len(latencies) >= messages:
            done.set()

    relay = CountingRelay(rig.js, rig.sessions, rig.outbox, metrics, rig.stop, poll_s=RELAY_POLL_S)
    if linger_s is not None:
        relay.linger_s = linger_s
    consumer = runner(rig.js, ping_consumer(handle, replay_safe), rig.uow, SERVICE, metrics, rig.stop)
    if not backlog:
        await rig.start(relay, consumer)
    started = time.perf_counter()
    cpu_started = time.process_time()

    await produce_all(rig, relay, messages, producers, events_per_commit, started, rate_per_s)
    result: dict[str, float] = {}
    if backlog:
        result["producers_per_s"] = messages / (time.perf_counter() - started)
        result["producers_cpu_us"] = (time.process_time() - cpu_started) / messages * 1e6
        await rig.start(relay, consumer)
        started, cpu_started = time.perf_counter(), time.process_time()
    await asyncio.wait_for(done.wait(), timeout=300)
    elapsed = time.perf_counter() - started
    cpu_us = (time.process_time() - cpu_started) / messages * 1e6
    await rig.close()
    if backlog:
        return {**result, "bus_per_s": messages / elapsed, "bus_cpu_us": cpu_us}
    return {
        "e2e_per_s": messages / elapsed,
        "e2e_p50_ms": statistics.median(latencies),
        "e2e_p99_ms": percentile(latencies, 0.99),
        "cpu_us": cpu_us,
        "rows_per_round": messages / max(1, relay.rounds),
    }


async def flat_out_and_paced(
    nats_url: str, database_url: str, args: argparse.Namespace, shape: dict[str, Any]
) -> dict[str, float]:
    """The path flat out, then paced at `args.load` of the rate it reached (`shape`: the relay's
    linger, the consumer's runner and whether its handler is replay-safe)."""
    shape = {
        "events_per_commit": args.events_per_commit,
        "handler_statements": args.handler_statements,
        **shape,
    }
    split: dict[str, float] = {}
    if args.baseline_consumer:  # the consumer is what differs: the bus alone shows it best
        split = await outbox_path(
            nats_url, database_url, args.messages, args.producers, backlog=True, **shape
        )
        print(f"  relay + consumer alone {split['bus_per_s']:.0f}/s", file=sys.stderr)
    flat_out = await outbox_path(nats_url, database_url, args.messages, args.producers, **shape)
    paced_rate = flat_out["e2e_per_s"] * args.load
    print(f"  flat out {flat_out['e2e_per_s']:.0f}/s; paced at {paced_rate:.0f}/s ...", file=sys.stderr)
    paced = await outbox_path(nats_url, database_url, args.messages, args.producers, paced_rate, **shape)
    return {
        "e2e_per_s": flat_out["e2e_per_s"],
        "e2e_p50_ms": paced["e2e_p50_ms"],
        "e2e_p99_ms": paced["e2e_p99_ms"],
        "saturated_p50_ms": flat_out["e2e_p50_ms"],
        "saturated_p99_ms": flat_out["e2e_p99_ms"],
        "e2e_cpu_us_per_msg": flat_out["cpu_us"],
        "relay_rows_per_round": flat_out["rows_per_round"],
        "paced_relay_rows_per_round": paced["rows_per_round"],
        **split,
    }


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    register_ping()
    nats_url, database_url, handles = start_servers(args.nats_url, args.database_url)
    load_before = os.getloadavg()[0]
    baseline = None if args.baseline_linger_ms is None else args.baseline_linger_ms / 1000
    try:
        nc = await nats.connect(nats_url)
        await ensure_bench_stream(nc.jetstream())
        await nc.close()
        print(f"raw JetStream publish: {args.messages} messages ...", file=sys.stderr)
        raw = await raw_publish_rate(nats_url, args.messages, args.window)
        split: dict[str, float] = {}
        if not args.baseline_consumer:  # else each side runs its own split
            print("producers alone, then relay and consumer alone ...", file=sys.stderr)
            split = await outbox_path(
                nats_url,
                database_url,
                args.messages,
                args.producers,
                backlog=True,
                events_per_commit=args.events_per_commit,
                replay_safe=args.replay_safe,
                handler_statements=args.handler_statements,
            )
        before: list[dict[str, float]] = []
        after: list[dict[str, float]] = []
        as_configured = {"replay_safe": args.replay_safe}
        baseline_shape: dict[str, Any] | None = None
        if args.baseline_consumer:
            baseline_shape = {"runner": SavepointPerMessageRunner}
        elif args.baseline_fetch:
            baseline_shape = {"runner": LingeringFetchRunner, **as_configured}
        elif baseline is not None:
            baseline_shape = {"linger_s": baseline, **as_configured}
        for repetition in range(args.repeat):
            # baseline first in even repetitions, last in odd ones, so a trend in the machine's load
            # favours neither side
            order = [True, False] if repetition % 2 == 0 else [False, True]
            for is_baseline in order if baseline_shape is not None else [False]:
                label = "baseline" if is_baseline else "as configured"
                print(f"[{repetition + 1}] {label}:", file=sys.stderr)
                runs = before if is_baseline else after
                shape = baseline_shape if is_baseline and baseline_shape is not None else as_configured
                runs.append(await flat_out_and_paced(nats_url, database_url, args, shape))
    finally:
        for handle in handles:
            handle.close()
    result: dict[str, Any] = {
        "raw_publish_per_s": raw,
        **medians(after),
        "latency_at_load": args.load,
        **{key: value for key, value in split.items() if key != "producers_cpu_us" and key != "bus_cpu_us"},
        "producers_cpu_us_per_msg": (split or medians(after))["producers_cpu_us"],
        "bus_cpu_us_per_msg": (split or medians(after))["bus_cpu_us"],
        "messages": args.messages,
        "producers": args.producers,
        "events_per_commit": args.events_per_commit,
        "replay_safe": args.replay_safe,
        "handler_statements": args.handler_statements,
        "repetitions": args.repeat,
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    if before:
        what: dict[str, Any] = {"relay_linger_ms": args.baseline_linger_ms}
        if args.baseline_consumer:
            what = {"consumer": "a savepoint and a release per message"}
        elif args.baseline_fetch:
            what = {"consumer": "a pull for one message, then a pull for the rest lingering 10 ms"}
        result["baseline"] = {**what, **medians(before)}
        result["ratio_e2e_per_s"] = [
            a["e2e_per_s"] / b["e2e_per_s"] for a, b in zip(after, before, strict=True)
        ]
        result["ratio_e2e_p99_ms"] = [
            a["e2e_p99_ms"] / b["e2e_p99_ms"] for a, b in zip(after, before, strict=True)
        ]
        result["ratio_e2e_cpu_us_per_msg"] = [
            a["e2e_cpu_us_per_msg"] / b["e2e_cpu_us_per_msg"] for a, b in zip(after, before, strict=True)
        ]
        if args.baseline_consumer:
            for key in ("bus_per_s", "bus_cpu_us"):
                result[f"ratio_{key}"] = [a[key] / b[key] for a, b in zip(after, before, strict=True)]
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bus", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=5000, help="messages per path (default 5000)")
    parser.add_argument(
        "--producers", type=int, default=8, help="concurrent producing transactions (default 8)"
    )
    parser.add_argument("--window", type=int, default=256, help="in-flight raw publishes (default 256)")
    parser.add_argument(
        "--load",
        type=float,
        default=0.5,
        help="latency is measured paced at this share of the measured throughput (default 0.5)",
    )
    parser.add_argument(
        "--events-per-commit",
        type=int,
        default=1,
        help="events each producer transaction commits, with one statement (default 1)",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="repetitions of the flat-out and paced paths (default 1)"
    )
    parser.add_argument(
        "--baseline-linger-ms",
        type=float,
        help="also run the paths with the relay lingering this long after a wake (0: as before it "
        "lingered), alternating with the relay as configured, for a before/after ratio",
    )
    parser.add_argument(
        "--baseline-consumer",
        action="store_true",
        help="also run every path with the consumer as it was (a savepoint and a release per message), "
        "alternating with the consumer as configured, for a before/after ratio",
    )
    parser.add_argument(
        "--baseline-fetch",
        action="store_true",
        help="also run every path with the consumer's former fetch (a pull for one message, then a "
        "pull for the rest lingering 10 ms), alternating with the consumer as configured",
    )
    parser.add_argument(
        "--replay-safe",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="declare the bench's consumer replay-safe: no savepoint on a batch's happy path (default)",
    )
    parser.add_argument(
        "--handler-statements",
        type=int,
        default=0,
        help="statements (SELECT 1) each handler sends, as a service's handler does (default 0)",
    )
    parser.add_argument("--nats-url", help="an existing NATS with JetStream (default: start an embedded one)")
    parser.add_argument("--database-url", help="an existing PostgreSQL (default: start an embedded one)")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.handler_statements < 0:
        parser.error("--handler-statements must not be negative")
    if min(args.messages, args.producers, args.window, args.events_per_commit, args.repeat) < 1:
        parser.error("--messages, --producers, --window, --events-per-commit and --repeat must be at least 1")
    if args.baseline_linger_ms is not None and args.baseline_linger_ms < 0:
        parser.error("--baseline-linger-ms must not be negative")
    if (args.baseline_linger_ms is not None) + args.baseline_consumer + args.baseline_fetch > 1:
        parser.error(
            "compare one thing at a time: --baseline-linger-ms, --baseline-consumer or --baseline-fetch"
        )
    if not 0 < args.load <= 1:
        parser.error("--load must be in (0, 1]")
    result = asyncio.run(run(args))
    print_table(result, args.baseline_consumer)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
