"""``tessera up`` restarts its embedded NATS and PostgreSQL after a SIGKILL, says so, and keeps their data."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import nats
import psutil  # type: ignore[import-untyped]
import pytest
from nats.js.api import StreamConfig

from libs.cli.tests.integration.test_up_embedded_stack import Up, state_dir

pytestmark = pytest.mark.integration

__all__ = ["state_dir"]  # the fixture, used by name


def _child_named(up: Up, name: str) -> psutil.Process:
    """The live child of ``tessera up`` whose executable is called ``name`` (nats-server, postgres)."""
    for child in psutil.Process(up.proc.pid).children():
        if child.name() == name and child.status() != psutil.STATUS_ZOMBIE:
            return child
    raise AssertionError(f"no live {name} under tessera up (pid {up.proc.pid}):\n{up.output}")


def _wait_for_output(up: Up, pattern: str, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while re.search(pattern, up.output) is None:
        assert up.proc.poll() is None, f"tessera up exited:\n{up.output}"
        assert time.monotonic() < deadline, f"{pattern!r} not printed within {within}s:\n{up.output}"
        time.sleep(0.1)


async def _insert(database_url: str, value: str) -> list[str]:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS notes (body text)")
        await conn.execute("INSERT INTO notes VALUES ($1)", value)
        return [str(r["body"]) for r in await conn.fetch("SELECT body FROM notes ORDER BY body")]
    finally:
        await conn.close()


async def _publish(nats_url: str, body: bytes) -> list[bytes]:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="RESTARTS", subjects=["restarts.>"]))
        await js.publish("restarts.one", body)
        info = await js.stream_info("RESTARTS")
        return [
            (await js.get_msg("RESTARTS", seq)).data or b""
            for seq in range(info.state.first_seq, info.state.last_seq + 1)
        ]
    finally:
        await nc.close()


async def test_nats_and_postgres_killed_with_sigkill_are_restarted_with_their_data(state_dir: Path) -> None:
    up = Up(state_dir, services="admission")
    try:
        endpoints = up.endpoints()
        nats_url, database_url = str(endpoints["nats_url"]), str(endpoints["database_url"])
        assert await _publish(nats_url, b"before") == [b"before"]
        assert await _insert(database_url, "a-before") == ["a-before"]

        # a client holds a backend open, as the services' pools do, when the postmaster dies
        held = await asyncpg.connect(database_url)
        nats_server, postmaster = _child_named(up, "nats-server"), _child_named(up, "postgres")
        os.kill(nats_server.pid, signal.SIGKILL)
        os.kill(postmaster.pid, signal.SIGKILL)

        _wait_for_output(up, r"nats +\| exited with code -9; restart #1 in")
        _wait_for_output(up, r"postgres +\| exited with code -9; restart #1 in")
        _wait_for_output(up, r"nats +\| restarted \(pid \d+\) and ready again")
        _wait_for_output(up, r"postgres +\| restarted \(pid \d+\) and ready again")
        assert _child_named(up, "nats-server").pid != nats_server.pid
        assert _child_named(up, "postgres").pid != postmaster.pid
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, OSError)):
            await held.fetchval("SELECT 1")  # its backend went with the old server
        held.terminate()

        # same URLs, same data, and new writes go through
        assert await _publish(nats_url, b"after") == [b"before", b"after"]
        assert await _insert(database_url, "b-after") == ["a-before", "b-after"]
        assert up.proc.poll() is None, "tessera up keeps running through the restarts"
        assert up.stop(signal.SIGTERM) == 0
    finally:
        up.kill()
    assert "stopping postgres" in up.output


async def test_a_second_up_after_a_postgres_sigkill_waits_for_its_recovery(state_dir: Path) -> None:
    first = Up(state_dir, services="admission")
    try:
        database_url = str(first.endpoints()["database_url"])
        assert await _insert(database_url, "a-first") == ["a-first"]
        postmaster = _child_named(first, "postgres")
        # a power cut: PostgreSQL and tessera up die at once. The postmaster leaves its postmaster.pid
        # behind, "ready" in it, and its data needs crash recovery at the next start
        os.kill(postmaster.pid, signal.SIGKILL)
        first.kill()
    finally:
        first.kill()
    gone, _ = await asyncio.to_thread(psutil.wait_procs, [postmaster], 30)
    assert gone, "the first PostgreSQL outlived its tessera up"

    assert (state_dir / "endpoints.json").exists(), "a run killed with SIGKILL leaves its endpoints"
    second = Up(state_dir, services="admission")
    try:
        # crash recovery, migrations and every service's start: as long as the endpoints may take
        _wait_for_output(second, "Tessera is up", within=180)
        again = second.endpoints()
        assert again["database_url"] == database_url
        assert await _insert(database_url, "b-second") == ["a-first", "b-second"]
        assert second.stop(signal.SIGTERM) == 0
    finally:
        second.kill()
    assert "reusing its data" in second.output
    assert "error" not in second.output.lower()
