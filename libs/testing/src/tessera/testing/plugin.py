"""pytest fixtures for real NATS and PostgreSQL (see ``tessera.testing.infra`` for where they come from).

Session scope: ``nats_server``/``nats_url`` and ``postgres_server``/``database_url``; servers start
only when a test asks for them and stop at the end of the session, on failure too (finalizers, plus
``atexit`` and a parent-death signal for the embedded processes).
Function scope: ``fresh_database``, a new empty database for one test, dropped afterwards;
``restartable_postgres``, a private embedded PostgreSQL that the test may crash and restart.
Traces: ``otlp_collector`` (session), an OTLP/HTTP receiver the services can export to
(``OTEL_EXPORTER_OTLP_ENDPOINT=otlp_collector.endpoint``); tests find their spans by trace id or
attribute, so they share it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tessera.testing.infra import (
    DatabaseServerHandle,
    ServerHandle,
    create_database,
    drop_database,
    resolve_nats,
    resolve_postgres,
)
from tessera.testing.otlp import OtlpCollector
from tessera.testing.restartable_postgres import restartable_postgres as restartable_postgres


@pytest.fixture(scope="session")
def nats_server() -> Iterator[ServerHandle]:
    """The session's NATS (JetStream on); ``restart()`` keeps its port and its streams."""
    handle = resolve_nats()
    try:
        handle.start()
        yield handle
    finally:
        handle.close()


@pytest.fixture(scope="session")
def nats_url(nats_server: ServerHandle) -> str:
    return nats_server.url


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[DatabaseServerHandle]:
    """The session's PostgreSQL; ``restart()`` keeps its port and its data."""
    handle = resolve_postgres()
    try:
        handle.start()
        yield handle
    finally:
        handle.close()


@pytest.fixture(scope="session")
def database_url(postgres_server: DatabaseServerHandle) -> str:
    """A plain ``postgresql://`` URL of the session's database (shared by every test)."""
    return postgres_server.url


@pytest.fixture
def fresh_database(postgres_server: DatabaseServerHandle) -> Iterator[str]:
    """The URL of a new, empty database on the session's server, dropped after the test."""
    name = create_database(postgres_server.url)
    try:
        yield postgres_server.url_for(name)
    finally:
        drop_database(postgres_server.url, name)


@pytest.fixture(scope="session")
def otlp_collector() -> Iterator[OtlpCollector]:
    """The session's OTLP/HTTP trace receiver on a free loopback port (see ``tessera.testing.otlp``)."""
    with OtlpCollector() as collector:
        yield collector
