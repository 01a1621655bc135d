"""Fixtures: a devcluster API server on a background thread and official-client APIs for it."""

from __future__ import annotations

import shutil
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


KUBECTL_INSTALL_HINT = (
    "kubectl is a binary dependency of these tests and was not found on PATH. Install it, e.g. "
    "`apt-get install kubectl` (from the pkgs.k8s.io apt repository) or download "
    "https://dl.k8s.io/release/v1.31.0/bin/linux/amd64/kubectl into a directory on PATH."
)


@pytest.fixture(scope="session")
def kubectl_path() -> str:
    """The real kubectl binary; its absence fails the test with how to install it (never a skip)."""
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail(KUBECTL_INSTALL_HINT)
    return found
