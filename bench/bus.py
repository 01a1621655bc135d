"""B0 — the message bus: raw JetStream publish rate beside the outbox -> relay -> consumer path.

    python -m bench.bus --messages 5000 --json bench/results/bus.json

Both run in one process against the same NATS and PostgreSQL (embedded ones unless --nats-url and
--database-url are given), so their ratio is what the transactional outbox and the idempotent
consumer cost over a bare publish. Besides the path flat out (producers, relay and consumer at once)
and its latency paced at a share of that rate, two figures split it: the producers alone (each
transaction commits one event; the relay is off) and the bus alone (relay and consumer carrying a
backlog the producers committed beforehand). CPU is this process's, in microseconds per message."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import nats
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine

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
RESULTS = Path(__file__).parent / "results"


class Ping(Message):
    TYPE: ClassVar[str] = "io.tessera.bench.ping.v1"
    SUBJECT: ClassVar[str] = "tessera.bench.evt.ping"

    n: int
    sent_at: datetime

    def key(self) -> str:
        return str(self.n)


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
        latencies.append((datetime.now(UTC) - ping.sent_at).total_seconds() * 1000)
        if len(latencies) >= messages:
            done.set()

    def uow() -> UnitOfWork:
        return UnitOfWork(sessions, outbox, inbox, "bench")

    relay = OutboxRelay(js, sessions, outbox, metrics, stop, poll_s=0.01)
    consumer = ConsumerRunner(
        js,
        ConsumerSpec(
            f"bench-{uuid.uuid4().hex[:8]}", SERVICE, Ping.SUBJECT, handle, ConsumerSettings(batch=256)
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
        for n in range(worker, messages, producers):
            if rate_per_s:
                await asyncio.sleep(max(0.0, started + n / rate_per_s - time.perf_counter()))
            async with uow() as unit:
                await unit.publish(Ping(n=n, sent_at=datetime.now(UTC)))
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
    }


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
    try:
        nc = await nats.connect(nats_url)
        await ensure_stream(nc.jetstream(), SERVICE, StreamLimits(max_bytes=4 * 1024**3))
        await nc.jetstream().purge_stream("TESSERA_BENCH")
        await nc.close()
        print(f"raw JetStream publish: {args.messages} messages ...", file=sys.stderr)
        raw = await raw_publish_rate(nats_url, args.messages, args.window)
        print("producers alone, then relay and consumer alone ...", file=sys.stderr)
        split = await outbox_path(nats_url, database_url, args.messages, args.producers, backlog=True)
        print(
            f"outbox -> relay -> consumer: {args.messages} messages, {args.producers} producers ...",
            file=sys.stderr,
        )
        flat_out = await outbox_path(nats_url, database_url, args.messages, args.producers)
        paced_rate = flat_out["e2e_per_s"] * args.load
        print(
            f"outbox -> relay -> consumer paced at {paced_rate:.0f}/s ({args.load:.0%} of that) ...",
            file=sys.stderr,
        )
        paced = await outbox_path(nats_url, database_url, args.messages, args.producers, paced_rate)
    finally:
        for handle in handles:
            handle.close()
    return {
        "raw_publish_per_s": raw,
        "e2e_per_s": flat_out["e2e_per_s"],
        "e2e_p50_ms": paced["e2e_p50_ms"],
        "e2e_p99_ms": paced["e2e_p99_ms"],
        "latency_at_load": args.load,
        "saturated_p50_ms": flat_out["e2e_p50_ms"],
        "saturated_p99_ms": flat_out["e2e_p99_ms"],
        "e2e_cpu_us_per_msg": flat_out["cpu_us"],
        "producers_per_s": split["producers_per_s"],
        "producers_cpu_us_per_msg": split["producers_cpu_us"],
        "bus_per_s": split["bus_per_s"],
        "bus_cpu_us_per_msg": split["bus_cpu_us"],
        "messages": args.messages,
        "producers": args.producers,
    }


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
    parser.add_argument("--nats-url", help="an existing NATS with JetStream (default: start an embedded one)")
    parser.add_argument("--database-url", help="an existing PostgreSQL (default: start an embedded one)")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.producers < 1 or args.window < 1:
        parser.error("--messages, --producers and --window must be at least 1")
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
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
