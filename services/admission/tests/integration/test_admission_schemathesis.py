"""Schemathesis against the running admission API (real Postgres and NATS, served by uvicorn):
every operation in its OpenAPI document, with a fixed seed and a bounded number of examples, must
answer no 5xx and only responses its document describes.

The document is the app's own, built without connecting to anything; one service, on a database of
its own, answers every operation of the module."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, seed, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.case import Case
from schemathesis.specs.openapi.checks import response_schema_conformance

from tessera.admission.bootstrap import build
from tessera.admission.config import AdmissionSettings
from tessera.core.db.migrations import migrate
from tessera.core.runner import create_app
from tessera.testing.infra import DatabaseServerHandle, create_database, drop_database
from tessera.testing.services import reset_jetstream, settings_for

pytestmark = pytest.mark.integration

EXAMPLES_PER_OPERATION = 15
SEED = 20261123


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _document() -> dict[str, Any]:
    offline = AdmissionSettings()
    return create_app(build(offline), offline).openapi()


schema = schemathesis.openapi.from_dict(_document())
schema.config.seed = SEED


@pytest.fixture(scope="module")
def live_admission(nats_url: str, postgres_server: DatabaseServerHandle) -> Iterator[str]:
    """The whole service (lifespan included) on a loopback port, as `tessera up` runs it."""
    asyncio.run(reset_jetstream(nats_url))
    database = create_database(postgres_server.url)
    url = postgres_server.url_for(database)
    migrate("admission", url)
    service_settings = settings_for(AdmissionSettings, nats_url, url, cycle_interval_s=0.2, auth="disabled")
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(build(service_settings), service_settings), port=port, log_config=None)
    )
    thread = threading.Thread(target=server.run, name="admission-under-fuzz", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "admission did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        drop_database(postgres_server.url, database)


@schema.parametrize()
@seed(SEED)
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_server_error_and_every_response_as_documented(case: Case, live_admission: str) -> None:
    case.call_and_validate(base_url=live_admission, checks=[not_a_server_error, response_schema_conformance])
