"""The API client keeps as many connections open as its caller asks for."""

from __future__ import annotations

from tessera.cluster.kube.adapter import api_client


def test_connections_size_the_client_pool_and_the_default_stays_the_clients_own() -> None:
    sized = api_client(url="http://127.0.0.1:1", connections=32)
    default = api_client(url="http://127.0.0.1:1")
    try:
        assert sized.configuration.connection_pool_maxsize == 32
        assert sized.rest_client.pool_manager.connection_pool_kw["maxsize"] == 32
        assert sized.configuration.host == "http://127.0.0.1:1"
        assert default.rest_client.pool_manager.connection_pool_kw["maxsize"] != 32
    finally:
        sized.close()  # type: ignore[no-untyped-call]
        default.close()  # type: ignore[no-untyped-call]
