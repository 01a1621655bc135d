"""Schemathesis against the running forecaster API (real Postgres and NATS, served by uvicorn) with no cluster to scale: every
operation in its OpenAPI document, with a fixed seed and a bounded number of examples, answers no 5xx
and only responses its document describes. Auth is disabled, as admission's fuzzing runs, so
`GET /v1/series` answers past the token check (its 401s are tested in the unit tests)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tessera.core.runner import create_app
from tessera.forecaster.bootstrap import build
from tessera.forecaster.config import ForecasterSettings
from tessera.testing.api_fuzz import api_test, openapi_schema, serving_service
from tessera.testing.infra import DatabaseServerHandle

pytestmark = pytest.mark.integration

_offline = ForecasterSettings()
schema = openapi_schema(create_app(build(_offline), _offline).openapi())


@pytest.fixture(scope="module")
def live_api(nats_url: str, postgres_server: DatabaseServerHandle) -> Iterator[str]:
    with serving_service(
        "forecaster",
        build,
        ForecasterSettings,
        nats_url,
        postgres_server,
        kubeconfig=None,
        grpc_port=0,
        auth="disabled",
    ) as url:
        yield url


test_no_server_error_and_every_response_as_documented = api_test(schema)
