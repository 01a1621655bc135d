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
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import nats
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import create_async_engine

from bench.bus_baseline import LingeringFetchRunner, SavepointPerMessageRunner
from tessera.contracts.base import Message
from tessera.contracts.events import BY_TYPE
from tessera.core.db.engine import async_url, make_engine, make_session_factory
from tessera.core.db.messaging_tables import add_messaging_tables
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.consumer import ConsumerRunner, ConsumerSpec
from tessera.core.messaging.envelope import Envelope
from tessera.core.messaging.outbox import OutboxRelay
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.core.observability.metrics import Metrics
from tessera.core.settings import ConsumerSettings

SERVICE = "bench"
SELECT_1 = text("SELECT 1")
RESULTS = Path(__file__).parent / "results"
#: the relay's poll when no commit wakes it (the services' `outbox_poll_s` is 0.5 s; 0.5 s here cost more
#: CPU per message on a backlog, 370-408 against 323-333 us in one ABBA run, so the bench keeps 10 ms)
RELAY_POLL_S = 0.01


class Ping(Message):
    TYPE: ClassVar[str] = "io.tessera.bench.ping.v1"
    SUBJECT: ClassVar[str] = "tessera.bench.evt.ping"

    n: int
    sent_at: datetime

    def key(self) -> str:
        return str(self.n)


class CountingRelay(OutboxRelay):
    """The relay, counting its rounds that published something: rows per round is how well it
    batches, a figure the machine's load does not blur the way it blurs rates."""

    rounds = 0

    async def publish_batch_outcomes(self) -> tuple[int, int]:
        published, failed = await super().publish_batch_outcomes()
        self.rounds += 1 if published else 0
        return published, failed


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


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
    metadata = MetaData(schema=SERVICE)
    outbox, inbox = add_messaging_tables(metadata)
    admin = create_async_engine(async_url(database_url))
    async with admin.begin() as conn:
        await conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {SERVICE} CASCADE")
        await conn.exec_driver_sql(f"CREATE SCHEMA {SERVICE}")
        await conn.run_sync(metadata.create_all)
    await admin.dispose()

    engine = make_engine(database_url, pool_size=producers + 4)
    sessions = make_session_factory(engine)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await js.purge_stream("TESSERA_BENCH")  # each run consumes only its own messages
    stop = asyncio.Event()
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

    def uow() -> UnitOfWork:
        return UnitOfWork(sessions, outbox, inbox, "bench")

    relay = CountingRelay(js, sessions, outbox, metrics, stop, poll_s=RELAY_POLL_S)
    if linger_s is not None:
        relay.linger_s = linger_s
    consumer = runner(
        js,
        ConsumerSpec(
            f"bench-{uuid.uuid4().hex[:8]}",
            SERVICE,
            Ping.SUBJECT,
            handle,
            ConsumerSettings(batch=256),
            replay_safe=replay_safe,
        ),
        uow,
        SERVICE,
        metrics,
        stop,
    )
    tasks: list[asyncio.Task[None]] = []

    async def start_bus() -> None:
        tasks.extend([asyncio.create_task(relay.run()), asyncio.create_task(consumer.run())])
        await consumer.subscribed.wait()

    if not backlog:
        await start_bus()
    started = time.perf_counter()
    cpu_started = time.process_time()

    async def produce(worker: int) -> None:
        step = producers * events_per_commit
        for first in range(worker * events_per_commit, messages, step):
            if rate_per_s:
                await asyncio.sleep(max(0.0, started + first / rate_per_s - time.perf_counter()))
            async with uow() as unit:
                now = datetime.now(UTC)
                last = min(first + events_per_commit, messages)
                await unit.publish_many([Ping(n=n, sent_at=now) for n in range(first, last)])
                await unit.commit()
            relay.wake()

    await asyncio.gather(*(produce(w) for w in range(producers)))
    result: dict[str, float] = {}
    if backlog:
        result["producers_per_s"] = messages / (time.perf_counter() - started)
        result["producers_cpu_us"] = (time.process_time() - cpu_started) / messages * 1e6
        await start_bus()
        started, cpu_started = time.perf_counter(), time.process_time()
    await asyncio.wait_for(done.wait(), timeout=300)
    elapsed = time.perf_counter() - started
    cpu_us = (time.process_time() - cpu_started) / messages * 1e6
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    await nc.close()
    await engine.dispose()
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
    from tessera.testing.infra import resolve_nats, resolve_postgres

    BY_TYPE[Ping.TYPE] = Ping  # the bench's own event type, known only inside this process
    handles = []
    nats_url, database_url = args.nats_url, args.database_url
    if not nats_url:
        handle = resolve_nats()
        handle.start()
        handles.append(handle)
        nats_url = handle.url
    if not database_url:
        pg = resolve_postgres()
        pg.start()
        handles.append(pg)
        database_url = pg.url
    load_before = os.getloadavg()[0]
    baseline = None if args.baseline_linger_ms is None else args.baseline_linger_ms / 1000
    try:
        nc = await nats.connect(nats_url)
        await ensure_stream(nc.jetstream(), SERVICE, StreamLimits(max_bytes=4 * 1024**3))
        await nc.jetstream().purge_stream("TESSERA_BENCH")
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
    print(f"{'path':<44}{'per second':>12}{'p50 ms':>10}{'p99 ms':>10}{'CPU us/msg':>12}")
    print(f"{'raw JetStream publish':<44}{result['raw_publish_per_s']:>12.0f}")
    print(
        f"{'outbox -> relay -> consumer, flat out':<44}{result['e2e_per_s']:>12.0f}"
        f"{result['saturated_p50_ms']:>10.1f}{result['saturated_p99_ms']:>10.1f}"
        f"{result['e2e_cpu_us_per_msg']:>12.0f}"
    )
    paced_label = f"  same, paced at {result['latency_at_load']:.0%}"
    print(
        f"{paced_label:<44}{result['e2e_per_s'] * result['latency_at_load']:>12.0f}"
        f"{result['e2e_p50_ms']:>10.1f}{result['e2e_p99_ms']:>10.1f}"
    )
    print(
        f"{'  producers alone (one event per commit)':<44}{result['producers_per_s']:>12.0f}{'':>20}"
        f"{result['producers_cpu_us_per_msg']:>12.0f}"
    )
    print(
        f"{'  relay + consumer alone (committed backlog)':<44}{result['bus_per_s']:>12.0f}{'':>20}"
        f"{result['bus_cpu_us_per_msg']:>12.0f}"
    )
    print(f"ratio raw / e2e: {result['raw_publish_per_s'] / result['e2e_per_s']:.1f}x")
    if "baseline" in result:
        base = result["baseline"]
        what = base.get("consumer") or f"relay lingering {base.get('relay_linger_ms')} ms"
        if args.baseline_consumer:
            print(
                f"baseline ({what}): relay + consumer alone {base['bus_per_s']:.0f}/s at "
                f"{base['bus_cpu_us']:.0f} us/msg; after / before per repetition: "
                + ", ".join(f"{r:.2f}" for r in result["ratio_bus_per_s"])
                + " (rate), "
                + ", ".join(f"{r:.2f}" for r in result["ratio_bus_cpu_us"])
                + " (CPU per message)"
            )
        print(
            f"baseline ({what}): {base['e2e_per_s']:.0f}/s flat out, "
            f"p99 {base['e2e_p99_ms']:.1f} ms paced; after / before per repetition: "
            + ", ".join(f"{r:.2f}" for r in result["ratio_e2e_per_s"])
            + " (rate), "
            + ", ".join(f"{r:.2f}" for r in result["ratio_e2e_p99_ms"])
            + " (p99)"
        )
    print(
        f"relay rows per round: {result['relay_rows_per_round']:.1f} flat out, "
        f"{result['paced_relay_rows_per_round']:.1f} paced"
        + (
            f" (baseline {result['baseline']['relay_rows_per_round']:.1f}, "
            f"{result['baseline']['paced_relay_rows_per_round']:.1f})"
            if "baseline" in result
            else ""
        )
    )
    print(f"load average (1 min) at start and end: {result['load_average_1m']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
