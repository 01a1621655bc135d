"""Where the time between a producer's commit and the handler goes, stage by stage, paced.

    python -m bench.bus_stages --rate 400 --messages 3000

Each event is timed at: the producer's commit, the relay's round taking its row (`SELECT ... FOR
UPDATE` answered), its PubAck, the consumer's fetch returning it, and its handler. All clocks are
this process's `time.perf_counter`, so the stages add up to the commit -> handler latency."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg
from nats.js.api import PubAck

from bench._bus_common import (
    RELAY_POLL_S,
    SERVICE,
    ensure_bench_stream,
    open_rig,
    percentile,
    ping_consumer,
    produce_all,
    register_ping,
    start_servers,
)
from bench.bus_baseline import LingeringFetchRunner
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.consumer import ConsumerRunner
from tessera.core.messaging.envelope import Envelope
from tessera.core.messaging.outbox import OutboxRelay
from tessera.core.observability.metrics import Metrics

STAGES = ("commit", "taken", "acked", "fetched", "handled")


class Clock:
    def __init__(self) -> None:
        self.at: dict[str, dict[str, float]] = {stage: {} for stage in STAGES}

    def mark(self, stage: str, ids: Sequence[str]) -> None:
        now = time.perf_counter()
        book = self.at[stage]
        for event_id in ids:
            book.setdefault(event_id, now)


class TimedRelay(OutboxRelay):
    clock: Clock

    async def _publish_all(self, rows: Sequence[Any]) -> list[PubAck | BaseException]:
        ids = [row.event_id for row in rows]
        self.clock.mark("taken", ids)
        outcomes = await super()._publish_all(rows)
        self.clock.mark("acked", ids)
        return outcomes


def timed(base: type[ConsumerRunner[UnitOfWork]]) -> type[ConsumerRunner[UnitOfWork]]:
    """`base`, marking when each fetched message reaches `handle_batch`."""

    class TimedRunner(base):  # type: ignore[valid-type,misc]
        clock: Clock

        async def handle_batch(self, msgs: list[Msg]) -> None:
            self.clock.mark("fetched", [(msg.headers or {}).get("ce-id", "") for msg in msgs])
            await super().handle_batch(msgs)

    return TimedRunner


async def paced(
    nats_url: str,
    database_url: str,
    args: argparse.Namespace,
    runner_class: type[ConsumerRunner[UnitOfWork]],
) -> dict[str, dict[str, float]]:
    messages, producers, rate, epc = args.messages, args.producers, args.rate, args.events_per_commit
    rig = await open_rig(nats_url, database_url, producers)
    await ensure_bench_stream(rig.js)
    done, clock = asyncio.Event(), Clock()
    handled = clock.at["handled"]

    async def handle(envelope: Envelope, uow: UnitOfWork) -> None:
        clock.mark("handled", [envelope.id])
        if len(handled) >= messages:
            done.set()

    relay = TimedRelay(rig.js, rig.sessions, rig.outbox, Metrics(), rig.stop, poll_s=RELAY_POLL_S)
    relay.clock = clock
    spec = ping_consumer(handle, replay_safe=True)
    runner = timed(runner_class)(rig.js, spec, rig.uow, SERVICE, Metrics(), rig.stop)
    runner.clock = clock  # type: ignore[attr-defined]
    await rig.start(relay, runner)
    started = time.perf_counter()

    def committed(ids: Sequence[str]) -> None:
        clock.mark("commit", ids)

    await produce_all(rig, relay, messages, producers, epc, started, rate, on_commit=committed)
    await asyncio.wait_for(done.wait(), timeout=300)
    await rig.close()
    figures: dict[str, dict[str, float]] = {}
    ids = list(handled)
    for before, after in itertools.pairwise(STAGES):
        spans = [(clock.at[after][i] - clock.at[before][i]) * 1000 for i in ids]
        figures[f"{before}->{after}"] = {"p50": statistics.median(spans), "p99": percentile(spans, 0.99)}
    total = [(handled[i] - clock.at["commit"][i]) * 1000 for i in ids]
    figures["commit->handled"] = {"p50": statistics.median(total), "p99": percentile(total, 0.99)}
    return figures


async def main_async(args: argparse.Namespace) -> None:
    register_ping()
    nats_url, database_url, handles = start_servers(None, None)
    sides: dict[str, list[dict[str, dict[str, float]]]] = {"before": [], "after": []}
    try:
        for repetition in range(args.repeat):
            order = ["before", "after"] if repetition % 2 == 0 else ["after", "before"]
            for side in order if args.baseline_fetch else ["after"]:
                runner: type[ConsumerRunner[UnitOfWork]] = (
                    LingeringFetchRunner if side == "before" else ConsumerRunner
                )
                print(f"[{repetition + 1}] {side} ...", file=sys.stderr)
                sides[side].append(await paced(nats_url, database_url, args, runner))
    finally:
        for handle in handles:
            handle.close()
    result: dict[str, Any] = {
        "rate_per_s": args.rate,
        "messages": args.messages,
        "producers": args.producers,
        "events_per_commit": args.events_per_commit,
        "load_average_1m": os.getloadavg()[0],
    }
    print(
        f"{'stage (median of runs)':<26}"
        + "".join(f"{s + ' p50':>14}{s + ' p99':>14}" for s, r in sides.items() if r)
    )
    for stage in sides["after"][0]:
        line = f"{stage:<26}"
        for side, runs in sides.items():
            if runs:
                p50 = statistics.median(run[stage]["p50"] for run in runs)
                p99 = statistics.median(run[stage]["p99"] for run in runs)
                result.setdefault(side, {})[stage] = {"p50_ms": p50, "p99_ms": p99}
                line += f"{p50:>14.1f}{p99:>14.1f}"
        print(line)
    if args.baseline_fetch:
        result["ratio_p99_commit_to_handled"] = [
            a["commit->handled"]["p99"] / b["commit->handled"]["p99"]
            for a, b in zip(sides["after"], sides["before"], strict=True)
        ]
        print("after / before, commit -> handled p99 per repetition:", result["ratio_p99_commit_to_handled"])
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bus_stages", description=__doc__)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--rate", type=float, default=400.0, help="events per second")
    parser.add_argument("--events-per-commit", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--baseline-fetch",
        action="store_true",
        help="also run with the consumer's former fetch (two pulls, the second lingering 10 ms), ABBA",
    )
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if min(args.messages, args.producers, args.events_per_commit, args.repeat) < 1 or args.rate <= 0:
        parser.error("--messages, --producers, --events-per-commit and --rate must be positive")
    print(f"paced at {args.rate:.0f}/s ...", file=sys.stderr)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
