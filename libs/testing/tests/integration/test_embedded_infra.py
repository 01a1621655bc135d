"""The embedded fallback for real: JetStream and PostgreSQL from the PyPI packages, restarts included."""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import nats
import pytest
from nats.js.api import StorageType, StreamConfig

from tessera.core.embedded import ComponentError, NatsServer, PostgresServer
from tessera.core.embedded.process import pid_alive
from tessera.testing.infra import EmbeddedServer, resolve_nats, resolve_postgres

pytestmark = pytest.mark.integration


@pytest.fixture
def embedded_nats() -> Iterator[EmbeddedServer]:
    handle = resolve_nats(env={}, docker_available=lambda: False)
    assert isinstance(handle, EmbeddedServer)
    handle.start()
    yield handle
    handle.close()


@pytest.fixture
def embedded_pg() -> Iterator[EmbeddedServer]:
    handle = resolve_postgres(env={}, docker_available=lambda: False)
    assert isinstance(handle, EmbeddedServer)
    handle.start()
    yield handle
    handle.close()


async def _stream_messages(url: str, stream: str) -> list[bytes]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        return [
            (await js.get_msg(stream, seq)).data or b""
            for seq in range(info.state.first_seq, info.state.last_seq + 1)
        ]
    finally:
        await nc.close()


async def test_embedded_nats_publish_ack_round_trip_survives_restart(embedded_nats: EmbeddedServer) -> None:
    url_before = embedded_nats.url
    nc = await nats.connect(url_before)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="ORDERS", subjects=["orders.>"], storage=StorageType.FILE))
    acks = [await js.publish("orders.created", f"order-{i}".encode()) for i in range(3)]
    sub = await js.pull_subscribe("orders.>", durable="reader")
    fetched = await sub.fetch(3, timeout=5)
    for msg in fetched:
        await msg.ack()
    await nc.close()

    assert [ack.seq for ack in acks] == [1, 2, 3]
    assert all(ack.stream == "ORDERS" for ack in acks)
    assert [m.data for m in fetched] == [b"order-0", b"order-1", b"order-2"]

    old_pid = embedded_nats.server.pid
    embedded_nats.restart()

    assert embedded_nats.url == url_before
    assert embedded_nats.server.pid != old_pid
    assert await _stream_messages(embedded_nats.url, "ORDERS") == [b"order-0", b"order-1", b"order-2"]


async def test_embedded_postgres_select_one_and_data_survive_restart(embedded_pg: EmbeddedServer) -> None:
    conn = await asyncpg.connect(embedded_pg.url)
    assert await conn.fetchval("SELECT 1") == 1
    await conn.execute("CREATE TABLE kept (id int primary key)")
    await conn.execute("INSERT INTO kept VALUES (7)")
    await conn.close()

    embedded_pg.restart()

    conn = await asyncpg.connect(embedded_pg.url)
    try:
        assert await conn.fetchval("SELECT id FROM kept") == 7
    finally:
        await conn.close()


@pytest.mark.parametrize("kind", ["nats", "postgres"])
def test_close_leaves_no_process_and_no_directory(kind: str) -> None:
    resolve = resolve_nats if kind == "nats" else resolve_postgres
    handle = resolve(env={}, docker_available=lambda: False)
    assert isinstance(handle, EmbeddedServer)
    handle.start()
    pid = handle.server.pid
    workdir = handle.workdir
    assert pid is not None and pid_alive(pid)
    assert workdir is not None and workdir.exists()

    handle.close()

    assert not pid_alive(pid)
    assert not workdir.exists()


# -- the session fixtures themselves (whatever source they resolved to) -------------------------------
async def test_nats_url_fixture_serves_jetstream(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="FIXTURE_PING", subjects=["fixture.ping"])
        ack = await js.publish("fixture.ping", b"ping")
        assert ack.stream == "FIXTURE_PING"
        assert (await js.get_msg("FIXTURE_PING", ack.seq)).data == b"ping"
    finally:
        await nc.close()


async def test_database_url_fixture_is_a_plain_postgresql_url(database_url: str) -> None:
    assert database_url.startswith("postgresql://")
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()


_fresh_names: list[str] = []


@pytest.fixture
async def marker_table(fresh_database: str) -> AsyncIterator[str]:
    _fresh_names.append(fresh_database.rsplit("/", 1)[1])
    conn = await asyncpg.connect(fresh_database)
    try:
        tables = await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        assert tables == 0, "a fresh database starts empty"
        await conn.execute("CREATE TABLE marker (id int)")
    finally:
        await conn.close()
    yield fresh_database


@pytest.mark.parametrize("round_", [1, 2])
async def test_fresh_database_is_new_and_empty_each_time(
    marker_table: str, database_url: str, round_: int
) -> None:
    # the marker table from the other round would make marker_table's emptiness check fail
    assert marker_table != database_url
    conn = await asyncpg.connect(marker_table)
    try:
        assert await conn.fetchval("SELECT count(*) FROM marker") == 0
    finally:
        await conn.close()


async def test_fresh_databases_are_dropped_after_their_test(database_url: str, fresh_database: str) -> None:
    # runs after the two rounds above (file order): their databases are gone, this one exists
    assert len(_fresh_names) == 2
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT datname FROM pg_database")
    finally:
        await conn.close()
    existing = {r["datname"] for r in rows}
    assert fresh_database.rsplit("/", 1)[1] in existing
    assert existing.isdisjoint(_fresh_names)


@pytest.mark.parametrize("kind", ["nats", "postgres"])
def test_a_taken_port_fails_fast_naming_the_component_and_its_log(kind: str) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="tessera-test-busy-"))
    workdir.chmod(0o755)
    try:
        with socket.socket() as blocker:
            blocker.bind(("127.0.0.1", 0))
            blocker.listen()
            port = blocker.getsockname()[1]
            server: NatsServer | PostgresServer = (
                NatsServer(workdir / "js", port=port)
                if kind == "nats"
                else PostgresServer(workdir / "pg", port=port, durable=False)
            )
            with pytest.raises(ComponentError) as err:
                server.start(timeout=30)
        assert err.value.component == kind
        assert "exited with code" in err.value.reason
        assert err.value.log_file == server.log_file
        assert str(server.log_file) in str(err.value)
        assert not server.is_running
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
