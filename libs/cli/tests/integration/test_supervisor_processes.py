"""The supervisor against real child processes: crash restarts, log prefixes, clean stops."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tessera.cli.supervisor import Backoff, ServiceSpec, Supervisor
from tessera.core.embedded.process import pid_alive

pytestmark = pytest.mark.integration

FAST = Backoff(initial=0.05, factor=2.0, maximum=0.2, reset_after=30.0)


class Lines:
    """A sink that records what the supervisor prints."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def __call__(self, name: str, line: str) -> None:
        self.lines.append((name, line))

    def of(self, name: str) -> list[str]:
        return [line for n, line in self.lines if n == name]


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


async def _until(predicate: Callable[[], bool], within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


async def test_crashing_child_is_restarted_and_its_output_prefixed(tmp_path: Path) -> None:
    log_file = tmp_path / "logs" / "crashy.log"
    sink = Lines()
    crashy = ServiceSpec(
        "crashy", _py("import sys; print('boom', flush=True); sys.exit(3)"), log_file=log_file
    )
    steady = ServiceSpec("steady", _py("import time; print('up', flush=True); time.sleep(60)"))
    supervisor = Supervisor([crashy, steady], sink=sink, backoff=FAST, stop_timeout=5)

    async with supervisor:
        await _until(lambda: supervisor.restarts("crashy") >= 3)
        steady_pid = supervisor.pid("steady")

    assert sink.of("crashy").count("boom") >= 3
    assert "exited with code 3; restart #1 in 0.1s" in sink.of("crashy")
    assert supervisor.last_exit_code("crashy") == 3
    assert supervisor.restarts("steady") == 0
    assert sink.of("steady") == ["up"]
    assert log_file.read_text().splitlines().count("boom") >= 3
    assert steady_pid is not None and not pid_alive(steady_pid)


async def test_environment_reaches_the_child() -> None:
    sink = Lines()
    spec = ServiceSpec(
        "env",
        _py("import os, time; print(os.environ['TESSERA_X'], flush=True); time.sleep(60)"),
        env={"TESSERA_X": "forty-two"},
    )
    async with Supervisor([spec], sink=sink, backoff=FAST) as supervisor:
        await _until(lambda: bool(sink.of("env")))
        assert supervisor.pid("env") is not None
    assert sink.of("env") == ["forty-two"]


async def test_stop_leaves_no_child_or_grandchild(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    parent = ServiceSpec(
        "parent",
        _py(
            f"""
            import subprocess, time
            child = subprocess.Popen(['sleep', '60'])
            open({str(pid_file)!r}, 'w').write(str(child.pid))
            print('spawned', flush=True)
            time.sleep(60)
            """
        ),
    )
    stubborn = ServiceSpec(
        "stubborn",
        _py(
            """
            import signal, time
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            print('ignoring SIGTERM', flush=True)
            time.sleep(60)
            """
        ),
    )
    sink = Lines()
    supervisor = Supervisor([parent, stubborn], sink=sink, backoff=FAST, stop_timeout=0.5)
    await supervisor.start()
    await _until(lambda: pid_file.exists() and bool(sink.of("stubborn")) and bool(pid_file.read_text()))
    pids = [supervisor.pid("parent"), supervisor.pid("stubborn"), int(pid_file.read_text())]

    await supervisor.stop()

    assert all(pid is not None for pid in pids)
    assert [pid for pid in pids if pid is not None and pid_alive(pid)] == []
    assert "did not stop in 0s: killing" in sink.of("stubborn")
    assert supervisor.restarts("parent") == 0 and supervisor.restarts("stubborn") == 0


DRIVER = """
import asyncio, sys
from tessera.cli.supervisor import ServiceSpec, Supervisor, run_until_signalled
specs = [ServiceSpec(n, [sys.executable, '-c', 'import os, time; print(os.getpid(), flush=True); time.sleep(60)'])
         for n in ('one', 'two')]
asyncio.run(run_until_signalled(Supervisor(specs, stop_timeout=5)))
print('stopped cleanly', flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_the_supervising_process_stops_everything(sig: int) -> None:
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert driver.stdout is not None
    child_pids = [int(driver.stdout.readline().split("|")[1]) for _ in range(2)]
    assert all(pid_alive(pid) for pid in child_pids)

    os.kill(driver.pid, sig)
    rest, _ = driver.communicate(timeout=20)

    assert driver.returncode == 0
    assert "stopped cleanly" in rest
    assert [pid for pid in child_pids if pid_alive(pid)] == []
