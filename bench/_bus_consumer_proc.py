"""The consuming service's side of `bench.bus_topology`: a process of its own that runs one durable
pull consumer of the bench's pings, as a service other than the producer's would.

    python -m bench._bus_consumer_proc --nats-url URL --database-url URL --messages N

It prints ``ready`` once subscribed, then, when it has handled ``N`` pings, one JSON line: each
ping's commit -> handler latency (the producer's ``sent_at`` against this process's wall clock, the
same machine's), the wall time it handled the last one at, and the CPU this process used meanwhile.
Its logs go to stderr."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import UTC, datetime

import nats
from sqlalchemy import MetaData

from bench._bus_common import SERVICE, Ping, ping_consumer, register_ping
from tessera.core.db.engine import make_engine, make_session_factory
from tessera.core.db.messaging_tables import add_messaging_tables
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.consumer import ConsumerRunner
from tessera.core.messaging.envelope import Envelope
from tessera.core.observability.metrics import Metrics


async def consume(nats_url: str, database_url: str, messages: int, replay_safe: bool) -> dict[str, object]:
    register_ping()
    outbox, inbox = add_messaging_tables(MetaData(schema=SERVICE))
    engine = make_engine(database_url, pool_size=4)
    sessions = make_session_factory(engine)
    nc = await nats.connect(nats_url)
    latencies: list[float] = []
    done, stop = asyncio.Event(), asyncio.Event()

    async def handle(envelope: Envelope, uow: UnitOfWork) -> None:
        ping = envelope.parse()
        assert isinstance(ping, Ping)
        latencies.append((datetime.now(UTC) - ping.sent_at).total_seconds() * 1000)
        if len(latencies) >= messages:
            done.set()

    def uow() -> UnitOfWork:
        return UnitOfWork(sessions, outbox, inbox, "bench-consumer")

    consumer = ConsumerRunner(
        nc.jetstream(), ping_consumer(handle, replay_safe), uow, SERVICE, Metrics(), stop
    )
    task = asyncio.create_task(consumer.run())
    try:
        await consumer.subscribed.wait()
        print("ready", flush=True)
        cpu_started = time.process_time()
        await asyncio.wait_for(done.wait(), timeout=300)
        finished_at = time.time()
        cpu_s = time.process_time() - cpu_started
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        await nc.close()
        await engine.dispose()
    return {"latencies_ms": latencies, "finished_at": finished_at, "cpu_s": cpu_s}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench._bus_consumer_proc", description=__doc__)
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--messages", type=int, required=True, help="pings to handle before reporting")
    parser.add_argument("--replay-safe", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    if args.messages < 1:
        parser.error("--messages must be at least 1")
    report = asyncio.run(consume(args.nats_url, args.database_url, args.messages, args.replay_safe))
    sys.stdout.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
