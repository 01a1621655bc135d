"""Run services as child processes: restart them when they crash, prefix their logs, stop them cleanly.

Each child runs in its own process group (so a terminal's Ctrl-C reaches only us, and stopping a
child also stops whatever it spawned) and gets SIGTERM from the kernel if we die. Stopping sends
SIGTERM to every group, waits, then SIGKILLs what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from tessera.core.embedded.process import parent_death_signal

#: receives (service name, one line of its output without the newline)
LineSink = Callable[[str, str], None]

_COLOURS = (36, 32, 33, 35, 34, 91, 92, 93, 95, 96)
_READ_LIMIT = 1 << 20


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    log_file: Path | None = None


@dataclass(frozen=True)
class Backoff:
    """Delay before restart number ``n`` (1-based) of a child that keeps crashing."""

    initial: float = 0.5
    factor: float = 2.0
    maximum: float = 5.0
    """A service killed under a fault schedule (or crashing while NATS or PostgreSQL is away) is
    back within seconds; a longer wait only lengthens the outage it recovers from."""
    #: a child that stayed up this long is considered healthy again: the delay starts over
    reset_after: float = 30.0

    def delay(self, consecutive_crashes: int) -> float:
        if consecutive_crashes < 1:
            raise ValueError(f"consecutive_crashes: must be at least 1, got {consecutive_crashes}")
        return float(min(self.maximum, self.initial * self.factor ** (consecutive_crashes - 1)))


class PrefixedWriter:
    """A ``LineSink`` writing ``name | line`` to a stream, the name coloured when it is a terminal."""

    def __init__(self, stream: TextIO, names: Sequence[str], colour: bool | None = None) -> None:
        self.stream = stream
        self.width = max((len(n) for n in names), default=0)
        if colour is None:
            colour = stream.isatty() and "NO_COLOR" not in os.environ
        self.colour = colour
        self._codes = {name: _COLOURS[i % len(_COLOURS)] for i, name in enumerate(names)}

    def __call__(self, name: str, line: str) -> None:
        label = f"{name:<{self.width}} |"
        if self.colour:
            label = f"\x1b[{self._codes.get(name, 37)}m{label}\x1b[0m"
        self.stream.write(f"{label} {line}\n")
        self.stream.flush()


@dataclass
class _Child:
    spec: ServiceSpec
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    last_exit_code: int | None = None
    task: asyncio.Task[None] | None = None


class Supervisor:
    """Keeps a set of services running until ``stop``."""

    def __init__(
        self,
        specs: Sequence[ServiceSpec],
        *,
        sink: LineSink | None = None,
        backoff: Backoff | None = None,
        stop_timeout: float = 10.0,
    ) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"services: names must be unique, got {names}")
        self._children = {s.name: _Child(s) for s in specs}
        self._sink = sink or PrefixedWriter(sys.stdout, names)
        self._backoff = backoff or Backoff()
        self._stop_timeout = stop_timeout
        self._stopping = asyncio.Event()

    # -- queries -----------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self._children)

    def restarts(self, name: str) -> int:
        return self._children[name].restarts

    def pid(self, name: str) -> int | None:
        proc = self._children[name].process
        return proc.pid if proc is not None and proc.returncode is None else None

    def last_exit_code(self, name: str) -> int | None:
        return self._children[name].last_exit_code

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Spawn every service (returns once they are spawned, not once they are ready)."""
        for child in self._children.values():
            child.process = await self._spawn(child.spec)
            child.task = asyncio.create_task(self._watch(child), name=f"supervise-{child.spec.name}")

    async def stop(self) -> None:
        """SIGTERM every service's process group, SIGKILL what is left after ``stop_timeout``."""
        self._stopping.set()
        live = [c.process for c in self._children.values() if c.process is not None]
        for proc in live:
            _signal_group(proc.pid, signal.SIGTERM)
        waits = [asyncio.create_task(p.wait()) for p in live if p.returncode is None]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=self._stop_timeout)
            for proc in live:
                if proc.returncode is None:
                    self._sink(self._name_of(proc), f"did not stop in {self._stop_timeout:.0f}s: killing")
            for task in pending:
                task.cancel()
        for proc in live:
            # the group may outlive its leader (a grandchild that ignored SIGTERM)
            _signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()
        tasks = [c.task for c in self._children.values() if c.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> Supervisor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- internals ---------------------------------------------------------------------------------
    def _name_of(self, proc: asyncio.subprocess.Process) -> str:
        for name, child in self._children.items():
            if child.process is proc:
                return name
        return "?"

    async def _spawn(self, spec: ServiceSpec) -> asyncio.subprocess.Process:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **spec.env}
        return await asyncio.create_subprocess_exec(
            *spec.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=parent_death_signal(signal.SIGTERM),
            limit=_READ_LIMIT,
        )

    async def _watch(self, child: _Child) -> None:
        loop = asyncio.get_running_loop()
        crashes = 0
        while True:
            proc = child.process
            assert proc is not None
            started = loop.time()
            pump = asyncio.create_task(self._pump(child.spec, proc))
            code = await proc.wait()
            # a grandchild may hold the pipe open after the child exited: do not wait on it for long
            _, still_reading = await asyncio.wait([pump], timeout=1.0)
            for task in still_reading:
                task.cancel()
            child.last_exit_code = code
            if self._stopping.is_set():
                return
            crashes = 1 if loop.time() - started >= self._backoff.reset_after else crashes + 1
            delay = self._backoff.delay(crashes)
            child.restarts += 1
            self._sink(
                child.spec.name,
                f"exited with code {code}; restart #{child.restarts} in {delay:.1f}s",
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=delay)
            if self._stopping.is_set():
                return
            child.process = await self._spawn(child.spec)

    async def _pump(self, spec: ServiceSpec, proc: asyncio.subprocess.Process) -> None:
        """Copy the child's output to the sink and its log file until the pipe closes."""
        assert proc.stdout is not None
        log = None
        if spec.log_file is not None:
            spec.log_file.parent.mkdir(parents=True, exist_ok=True)
            log = spec.log_file.open("a", encoding="utf-8")
        try:
            while True:
                try:
                    raw = await proc.stdout.readline()
                except ValueError:  # a line longer than the read limit: take what is buffered
                    raw = await proc.stdout.read(_READ_LIMIT)
                if not raw:
                    return
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                self._sink(spec.name, line)
                if log is not None:
                    log.write(line + "\n")
                    log.flush()
        finally:
            if log is not None:
                log.close()


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def run_until_signalled(supervisor: Supervisor, stop: asyncio.Event | None = None) -> None:
    """Start, then stop on SIGINT/SIGTERM (or when ``stop`` is set)."""
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with supervisor:
            await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
