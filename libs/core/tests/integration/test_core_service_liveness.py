"""A service's liveness and visibility on real NATS and PostgreSQL, through its FastAPI app: a dead
consumer task or a connection closed for good fails /healthz (so it is restarted); a connection cut
under it comes back by itself; /metrics shows the outbox, the consumers and the connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from fastapi import FastAPI

from tessera.contracts import subjects
from tessera.contracts.events import SubmitJob
from tessera.core.runner import ServiceDefinition, context_only, create_app
from tessera.core.settings import ServiceSettings
from tessera.testing.services import eventually, read_stream, settings_for
from tessera.testing.tcp_proxy import CuttableProxy, cuttable_proxy

from .poison_harness import CONSUMER, Behaviour, Bus, inbox, open_bus, outbox, spec

pytestmark = pytest.mark.integration


@pytest.fixture
async def bus(nats_url: str, fresh_database: str) -> AsyncIterator[Bus]:
    async with open_bus(nats_url, fresh_database) as b:
        yield b


@asynccontextmanager
async def serving(
    bus: Bus, behaviour: Behaviour, nats_url: str
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    definition: ServiceDefinition[object] = ServiceDefinition(
        name="admission",
        outbox=outbox,
        inbox=inbox,
        dependencies=context_only,
        consumers=lambda deps: [spec(behaviour)],
    )
    settings = settings_for(ServiceSettings, nats_url, bus.database_url, nats_reconnect_wait_s=0.2)
    app = create_app(definition, settings)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://svc") as client,
    ):
        yield app, client


def consumer_task() -> asyncio.Task[object]:
    return next(t for t in asyncio.all_tasks() if t.get_name() == f"admission-{CONSUMER}")


async def test_a_dead_consumer_task_fails_healthz_and_readyz(bus: Bus, nats_url: str) -> None:
    async with serving(bus, Behaviour(), nats_url) as (_, client):
        assert (await client.get("/healthz")).status_code == 200
        task = consumer_task()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        health = await client.get("/healthz")
        assert health.status_code == 503
        assert health.json()["problems"] == {f"task admission-{CONSUMER}": "cancelled"}
        ready = await client.get("/readyz")
        assert ready.status_code == 503 and f"task admission-{CONSUMER}" in ready.json()["problems"]


async def test_a_nats_connection_closed_for_good_fails_healthz(bus: Bus, nats_url: str) -> None:
    async with serving(bus, Behaviour(), nats_url) as (app, client):
        await app.state.ctx.nc.close()
        health = await client.get("/healthz")
        assert health.status_code == 503 and health.json()["problems"]["nats"] == "connection closed for good"


async def test_a_cut_connection_comes_back_and_the_service_carries_on(bus: Bus, nats_url: str) -> None:
    behaviour = Behaviour()
    async with cuttable_proxy(nats_url) as proxy, serving(bus, behaviour, proxy.url()) as (app, client):
        await bus.publish("before")
        await eventually(lambda: _true("before" in behaviour.handled), what="a message before the cut")
        assert await proxy.cut() >= 2, "the service's connection went through the proxy"
        await eventually(lambda: _connected_again(app, proxy), timeout=20, what="the service reconnected")

        await bus.publish("after")  # a consumer fetch and a relay publish, both on the new connection
        async with app.state.ctx.uow() as uow:
            await uow.publish(SubmitJob(job_id="from-outbox", spec={}))
            await uow.commit()
        await eventually(
            lambda: _true("after" in behaviour.handled), timeout=20, what="a message after the cut"
        )
        stored = await eventually(
            lambda: _stored(bus, "from-outbox"), timeout=20, what="the relay's event after the cut"
        )
        assert stored == 1
        assert (await client.get("/healthz")).status_code == 200
        exposition = (await client.get("/metrics")).text
    assert 'tessera_nats_connection_events_total{event="reconnected"}' in exposition
    assert 'tessera_nats_connection_events_total{event="disconnected"}' in exposition
    assert "tessera_nats_connected 1.0" in exposition


async def test_metrics_show_the_outbox_the_consumers_and_their_dead_letters(bus: Bus, nats_url: str) -> None:
    behaviour = Behaviour()
    async with serving(bus, behaviour, nats_url) as (app, client):
        await bus.publish("flaky-1")
        await bus.publish("refused-1")
        await eventually(
            lambda: _true(len(behaviour.letters) == 1 and "flaky-1" in behaviour.handled), what="both settled"
        )
        await app.state.ctx.relay.sample()
        exposition = (await client.get("/metrics")).text
    for family in (
        "tessera_outbox_backlog_rows",
        "tessera_outbox_oldest_age_seconds",
        "tessera_outbox_dead_letter_rows",
        "tessera_outbox_publish_failures_total",
        "tessera_outbox_dead_lettered_total",
        "tessera_consumer_lag_messages",
    ):
        assert f"# TYPE {family}" in exposition, family
    assert f'tessera_dead_letters_total{{consumer="{CONSUMER}",kind="permanent"}} 1.0' in exposition
    assert f'tessera_consumer_redeliveries_total{{consumer="{CONSUMER}"}} 1.0' in exposition
    assert f'tessera_consumer_lag_messages{{consumer="{CONSUMER}"}}' in exposition
    assert "tessera_outbox_backlog_rows 0.0" in exposition


async def _connected_again(app: FastAPI, proxy: CuttableProxy) -> bool:
    return bool(app.state.ctx.nc.is_connected) and proxy.accepted >= 2


async def _stored(bus: Bus, job_id: str) -> int | None:
    found = [
        e
        for e in await read_stream(bus.nc.jetstream(), subjects.SUBMIT_JOB, idle_s=0.2)
        if e.subject == job_id
    ]
    return len(found) or None


async def _true(value: bool) -> bool:
    return value
