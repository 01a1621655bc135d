"""Fixtures: a devcluster API server on a background thread and official-client APIs for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from tessera.devcluster.apiserver import ApiServer


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    server = ApiServer(history=1000)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def api_client(apiserver: ApiServer) -> Iterator[client.ApiClient]:
    configuration = client.Configuration()
    configuration.host = apiserver.url
    with client.ApiClient(configuration) as api:
        yield api


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)
