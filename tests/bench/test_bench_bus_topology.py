"""`bench.bus_topology`'s second process: the consumer runs apart from the producers and the relay,
handles every event once, and reports its latencies and its own CPU."""

from __future__ import annotations

import nats
import pytest

from bench._bus_common import ensure_bench_stream, register_ping
from bench.bus_topology import two_processes

pytestmark = pytest.mark.integration


async def test_the_consumer_process_handles_every_event_and_reports_its_cpu(
    nats_url: str, fresh_database: str
) -> None:
    register_ping()
    nc = await nats.connect(nats_url)
    await ensure_bench_stream(nc.jetstream())
    await nc.close()

    figures = await two_processes(nats_url, fresh_database, 120, 4)

    assert figures["handled"] == 120
    assert 0 < figures["e2e_p50_ms"] <= figures["e2e_p99_ms"]
    assert 0 < figures["consumer_cpu_us"] < figures["cpu_us"]
    assert figures["rows_per_round"] >= 1
