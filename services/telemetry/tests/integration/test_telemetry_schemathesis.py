"""Schemathesis against the running telemetry API (real Postgres and NATS, served by uvicorn), reading the example cluster's file: every
operation in its OpenAPI document, with a fixed seed and a bounded number of examples, answers no 5xx
and only responses its document describes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.core.runner import create_app
from tessera.telemetry.bootstrap import build
from tessera.telemetry.config import TelemetrySettings
from tessera.testing.api_fuzz import api_test, openapi_schema, serving_service
from tessera.testing.infra import DatabaseServerHandle

pytestmark = pytest.mark.integration

CLUSTER = Path(__file__).resolve().parents[4] / "examples" / "clusters" / "dev-4x8.yaml"

_offline = TelemetrySettings(cluster_file=CLUSTER, auth="disabled")
schema = openapi_schema(create_app(build(_offline), _offline).openapi())


@pytest.fixture(scope="module")
def live_api(nats_url: str, postgres_server: DatabaseServerHandle) -> Iterator[str]:
    with serving_service(
        "telemetry",
        build,
        TelemetrySettings,
        nats_url,
        postgres_server,
        cluster_file=CLUSTER,
        auth="disabled",
    ) as url:
        yield url


test_no_server_error_and_every_response_as_documented = api_test(schema)
