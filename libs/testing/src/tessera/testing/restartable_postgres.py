"""A private PostgreSQL that one test owns and can crash: SIGKILL the postmaster, start it again.

The session's PostgreSQL (``postgres_server``) is shared and may come from an environment URL, so a
test that crashes the database gets its own embedded server instead, in a temporary directory that
is removed afterwards. ``kill()`` is a crash, not a shutdown: the postmaster gets SIGKILL and its
backends, left without it, end on their own as they notice (PostgreSQL refuses to start again on a
data directory whose shared memory an old process still holds). ``start()`` then brings it back on
the same port and data directory, through crash recovery.

Commits are synchronous (unlike the other embedded test servers, which turn ``synchronous_commit``
off for speed): a crash must not lose a commit the client was told about. ``fsync`` stays off, since
a killed process loses nothing the kernel already holds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from tessera.core.embedded import PostgresServer
from tessera.core.embedded.process import pid_alive

__all__ = ["RestartablePostgres", "restartable_postgres"]


class _CrashSafePostgres(PostgresServer):
    """An embedded server whose acknowledged commits survive a crash of its processes."""

    def command(self) -> list[str]:
        # a later -c wins over the synchronous_commit=off that non-durable servers get
        return [*super().command(), "-c", "synchronous_commit=on"]

    def is_ready(self) -> bool:
        # after a crash the old postmaster.pid still says "ready": only the new postmaster's counts
        try:
            first = (self.data_dir / "postmaster.pid").read_text().splitlines()[0].strip()
        except (OSError, IndexError):
            return False
        return first == str(self.pid) and super().is_ready()


class RestartablePostgres:
    """An embedded PostgreSQL in a private directory; ``kill()`` crashes it, ``start()`` restarts it."""

    def __init__(self, workdir: Path | None = None) -> None:
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="tessera-test-pgcrash-"))
        self.workdir.chmod(0o755)  # the server may run as another user, which must traverse it
        self.server = _CrashSafePostgres(
            self.workdir / "data", log_file=self.workdir / "postgres.log", durable=False
        )
        #: how many backends were still alive after a kill and had to be killed too (0: none)
        self.orphans_killed = 0

    @property
    def url(self) -> str:
        """The URL of the server's application database (created on first start)."""
        return self.server.url

    def url_for(self, database: str) -> str:
        return self.server.url_for(database)

    @property
    def pid(self) -> int | None:
        """The postmaster's process id; ``None`` while it is down."""
        return self.server.pid if self.server.is_running else None

    def start(self, timeout: float = 60.0) -> None:
        """Start (or start again, after ``kill``) on the same port and data directory; wait until ready."""
        self.server.start(timeout=timeout)

    def kill(self, orphan_grace_s: float = 10.0) -> None:
        """SIGKILL the postmaster, then wait for its backends to end; they notice its death and exit.

        Backends still alive after ``orphan_grace_s`` get SIGKILL too (counted in ``orphans_killed``)."""
        pid = self.server.pid
        if pid is None or not self.server.is_running:
            raise RuntimeError("the PostgreSQL server is not running")
        os.kill(pid, signal.SIGSTOP)  # frozen, it forks no backend we would miss
        children = _children(pid)
        os.kill(pid, signal.SIGKILL)
        self.server.stop()  # reaps the postmaster; sends nothing more, since it is gone
        deadline = time.monotonic() + orphan_grace_s
        while any(pid_alive(child) for child in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        for child in children:
            if pid_alive(child):
                self.orphans_killed += 1
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
        while any(pid_alive(child) for child in children):
            time.sleep(0.05)

    def close(self) -> None:
        """Stop the server for good and remove its directory: killed, since its data is thrown away."""
        if self.server.is_running:
            self.kill(orphan_grace_s=0)
        self.server.cleanup()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _children(pid: int) -> list[int]:
    # not its process group: PostgreSQL puts each child in a session of its own
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


@pytest.fixture
def restartable_postgres() -> Iterator[RestartablePostgres]:
    """A started private PostgreSQL for one test, which it may kill and restart; removed afterwards."""
    server = RestartablePostgres()
    try:
        server.start()
        yield server
    finally:
        server.close()
