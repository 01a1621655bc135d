"""InfraWatch restarts a server process that died, with a growing backoff while restarts fail."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tessera.cli.infra_watch import InfraWatch
from tessera.cli.supervisor import Backoff
from tessera.core.embedded import ManagedProcess

pytestmark = pytest.mark.integration


class Sleeper(ManagedProcess):
    """A process that runs until killed; ready once it has written its pid file. With ``broken``
    set, every later start exits at once with code 3 (a server that cannot come back)."""

    component = "sleeper"

    def __init__(self, root: Path) -> None:
        super().__init__(root / "sleeper.log")
        self.pid_file = root / "sleeper.pid"
        self.broken = False

    def command(self) -> list[str]:
        if self.broken:
            return [sys.executable, "-c", "raise SystemExit(3)"]
        script = "import os, pathlib, sys, time; pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); time.sleep(600)"
        return [sys.executable, "-c", script, str(self.pid_file)]

    def prepare(self) -> None:
        self.pid_file.unlink(missing_ok=True)

    def is_ready(self) -> bool:
        return self.pid_file.exists() and self.pid_file.read_text() == str(self.pid)


async def _until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "condition never held"
        await asyncio.sleep(0.02)


async def test_a_killed_server_is_restarted_and_the_console_told(tmp_path: Path) -> None:
    server = Sleeper(tmp_path)
    server.start(timeout=20)
    said: list[str] = []
    watch = InfraWatch(
        server, lambda name, line: said.append(f"{name}: {line}"), backoff=Backoff(initial=0.05)
    )
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    try:
        first = server.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await _until(lambda: any("restarted" in line for line in said))
        assert said[0] == "sleeper: exited with code -9; restart #1 in 0.1s"
        assert said[1].startswith("sleeper: restarted (pid ")
        assert server.is_running and server.pid != first
        assert watch.restarts == 1
    finally:
        stop.set()
        await task
        server.stop()


async def test_restarts_that_keep_failing_back_off_further_each_time(tmp_path: Path) -> None:
    server = Sleeper(tmp_path)
    server.start(timeout=20)
    said: list[str] = []
    watch = InfraWatch(
        server,
        lambda name, line: said.append(line),
        backoff=Backoff(initial=0.1, factor=2.0, maximum=0.4),
        ready_timeout=5,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    try:
        server.broken = True
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        await _until(lambda: sum("failed" in line for line in said) >= 4)
        delays = [line.split(" in ")[-1] for line in said if "; restart #" in line][:4]
        assert delays == ["0.1s", "0.2s", "0.4s", "0.4s"]  # doubling, then capped
        assert (
            said[1]
            == f"restart #1 failed: exited with code 3 while starting (log: {tmp_path / 'sleeper.log'})"
        )
        assert said[2] == "exited with code 3; restart #2 in 0.2s"

        server.broken = False  # the server can come back: the next try succeeds
        await _until(lambda: server.is_running and "restarted" in said[-1])
    finally:
        stop.set()
        await task
        server.stop()
