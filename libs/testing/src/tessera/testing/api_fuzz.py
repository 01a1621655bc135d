"""Schemathesis against a running service's HTTP API: every operation of its OpenAPI document, with a
fixed seed and a bounded number of examples, must answer no 5xx and only responses its document
describes.

A service's test module holds only what is its own: the document (the app's own, built without
connecting to anything), a `live_api` fixture that serves the service, and the test made here::

    schema = openapi_schema(create_app(build(offline), offline).openapi())

    @pytest.fixture(scope="module")
    def live_api(nats_url, postgres_server):
        with serving_service("checkpoint", build, CheckpointSettings, nats_url, postgres_server) as url:
            yield url

    test_api_as_documented = api_test(schema)

The service runs whole (lifespan, consumers, relay and background tasks) under uvicorn on a loopback
port, on a migrated database of its own and an empty JetStream, as `tessera up` runs it."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import schemathesis
import uvicorn
from hypothesis import HealthCheck, seed, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.case import Case
from schemathesis.specs.openapi.checks import response_schema_conformance
from schemathesis.specs.openapi.schemas import OpenApiSchema

from tessera.core.db.migrations import migrate
from tessera.core.runner import ServiceDefinition, create_app
from tessera.core.settings import ServiceSettings
from tessera.testing.infra import DatabaseServerHandle, create_database, drop_database
from tessera.testing.services import reset_jetstream, settings_for

SEED = 20261123
#: examples per operation: small, since every service's suite runs on CI's two cores
EXAMPLES = 15
CHECKS = [not_a_server_error, response_schema_conformance]

S = TypeVar("S", bound=ServiceSettings)


def openapi_schema(document: dict[str, Any]) -> OpenApiSchema:
    """The document as Schemathesis reads it, with the fixed seed."""
    schema = schemathesis.openapi.from_dict(document)
    schema.config.seed = SEED
    return schema


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def serving(app: Any, name: str) -> Iterator[str]:
    """`app` (lifespan included) served by uvicorn on a loopback port, in a thread; yields its URL."""
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_config=None))
    thread = threading.Thread(target=server.run, name=f"{name}-under-fuzz", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, f"{name} did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@contextmanager
def serving_service(
    service: str,
    build: Callable[[S], ServiceDefinition[Any]],
    settings_class: type[S],
    nats_url: str,
    postgres_server: DatabaseServerHandle,
    **overrides: Any,
) -> Iterator[str]:
    """The service `build` wires, on an empty JetStream and a migrated database of its own (dropped
    afterwards), served as `serving` does; `overrides` go to its settings."""
    asyncio.run(reset_jetstream(nats_url))
    database = create_database(postgres_server.url)
    try:
        url = postgres_server.url_for(database)
        migrate(service, url)
        service_settings = settings_for(settings_class, nats_url, url, **overrides)
        with serving(create_app(build(service_settings), service_settings), service) as base_url:
            yield base_url
    finally:
        drop_database(postgres_server.url, database)


def api_test(schema: OpenApiSchema, examples: int = EXAMPLES) -> Callable[..., None]:
    """A test of every operation in `schema` against the base URL the module's `live_api` fixture
    yields: no 5xx, and every response as the document describes it. Derandomised by the fixed seed."""

    def check(case: Case[Any], live_api: str) -> None:
        case.call_and_validate(base_url=live_api, checks=CHECKS)

    check.__doc__ = api_test.__doc__
    fuzzed = settings(
        max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )(seed(SEED)(check))
    return schema.parametrize()(fuzzed)  # type: ignore[no-any-return]
