"""Keep ``tessera up``'s embedded NATS and PostgreSQL running: restart one that died, with backoff.

The services only need the server back on the same port with the same data: their NATS clients
reconnect and their database pools open new connections (see docs/adr/0027-supervised-local-stack.md).
A restart runs in a worker thread, so the console and the services' supervisor keep going while
PostgreSQL replays its WAL.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from tessera.cli.supervisor import Backoff
from tessera.core.embedded import ComponentError, ManagedProcess

#: receives (component name, what happened)
Say = Callable[[str, str], None]


class InfraWatch:
    """Watches one embedded server and restarts it, with ``backoff``, each time it exits."""

    def __init__(
        self,
        server: ManagedProcess,
        say: Say,
        *,
        backoff: Backoff | None = None,
        ready_timeout: float = 60.0,
        poll_interval: float = 0.25,
    ) -> None:
        if ready_timeout <= 0:
            raise ValueError(f"ready_timeout: must be positive, got {ready_timeout}")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval: must be positive, got {poll_interval}")
        self.server = server
        self.restarts = 0
        self._say = say
        self._backoff = backoff or Backoff()
        self._ready_timeout = ready_timeout
        self._poll_interval = poll_interval

    @property
    def name(self) -> str:
        return self.server.component

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop`` is set: notice an exit, wait the backoff, restart, say what happened."""
        loop = asyncio.get_running_loop()
        crashes = 0
        up_since = loop.time()
        while not stop.is_set():
            if self.server.is_running:
                await _wait(stop, self._poll_interval)
                continue
            code = self.server.exit_code
            crashes = 1 if loop.time() - up_since >= self._backoff.reset_after else crashes + 1
            delay = self._backoff.delay(crashes)
            self.restarts += 1
            self._say(self.name, f"exited with code {code}; restart #{self.restarts} in {delay:.1f}s")
            if await _wait(stop, delay):
                return
            # the backoff grows while restarts keep failing, and starts over once one stays up
            up_since = loop.time()
            try:
                await asyncio.to_thread(self.server.restart, self._ready_timeout)
            except ComponentError as err:
                where = f" (log: {err.log_file})" if err.log_file is not None else ""
                self._say(self.name, f"restart #{self.restarts} failed: {err.reason.splitlines()[0]}{where}")
                continue
            except OSError as err:  # the executable vanished, the data directory is unreadable...
                self._say(self.name, f"restart #{self.restarts} failed: {err}")
                continue
            up_since = loop.time()
            self._say(self.name, f"restarted (pid {self.server.pid}) and ready again")


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` or until ``stop``; whether ``stop`` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    return stop.is_set()
