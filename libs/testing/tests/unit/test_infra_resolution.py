"""Which NATS and PostgreSQL the fixtures pick: an env URL first, then Docker, then embedded."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tessera.testing import infra
from tessera.testing.infra import (
    DATABASE_URL_ENV,
    NATS_URL_ENV,
    ContainerServer,
    EmbeddedServer,
    ExternalServer,
    RestartUnsupported,
    ServerHandle,
    resolve_nats,
    resolve_postgres,
    with_database,
)


def _never_docker() -> bool:
    raise AssertionError("an environment URL must win before Docker is even probed")


Resolver = Callable[..., ServerHandle]


@pytest.mark.parametrize(
    ("resolve", "env_var", "url"),
    [
        (resolve_nats, NATS_URL_ENV, "nats://10.1.2.3:4222"),
        (resolve_postgres, DATABASE_URL_ENV, "postgresql://u:p@db.example:5432/app"),
    ],
)
def test_env_url_wins_over_docker_and_embedded(resolve: Resolver, env_var: str, url: str) -> None:
    handle = resolve(env={env_var: url}, docker_available=_never_docker)

    assert isinstance(handle, ExternalServer)
    assert handle.url == url
    assert handle.source == "env"
    assert not handle.can_restart


@pytest.mark.parametrize("resolve", [resolve_nats, resolve_postgres])
def test_blank_env_url_is_ignored(resolve: Resolver) -> None:
    handle = resolve(env={NATS_URL_ENV: "  ", DATABASE_URL_ENV: ""}, docker_available=lambda: False)
    try:
        assert isinstance(handle, EmbeddedServer)
        assert handle.source == "embedded"
    finally:
        handle.close()


@pytest.mark.parametrize(
    ("resolve", "url_prefix"), [(resolve_nats, "nats://127.0.0.1:"), (resolve_postgres, "postgresql://")]
)
def test_docker_comes_second_when_an_engine_answers(
    resolve: Resolver, url_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    created: list[str] = []

    class FakeDockerContainer:
        def __init__(self, image: str) -> None:
            created.append(image)

        def with_bind_ports(self, *_: object) -> FakeDockerContainer:
            return self

        def with_command(self, *_: object) -> FakeDockerContainer:
            return self

        def with_env(self, *_: object) -> FakeDockerContainer:
            return self

    import testcontainers.core.container as tc

    monkeypatch.setattr(tc, "DockerContainer", FakeDockerContainer)

    handle = resolve(env={}, docker_available=lambda: True)

    assert isinstance(handle, ContainerServer)
    assert handle.source == "docker"
    assert handle.url.startswith(url_prefix)
    assert created and created[0] in {infra.NATS_IMAGE, infra.POSTGRES_IMAGE}


@pytest.mark.parametrize("resolve", [resolve_nats, resolve_postgres])
def test_embedded_is_the_fallback(resolve: Resolver) -> None:
    handle = resolve(env={}, docker_available=lambda: False)
    try:
        assert isinstance(handle, EmbeddedServer)
        assert handle.can_restart
    finally:
        handle.close()


@pytest.mark.parametrize("action", ["stop", "restart"])
def test_external_server_refuses_to_be_stopped(action: str) -> None:
    handle = ExternalServer(NATS_URL_ENV, "nats://127.0.0.1:4222")

    with pytest.raises(RestartUnsupported, match=NATS_URL_ENV):
        getattr(handle, action)()


@pytest.mark.parametrize(
    ("url", "database", "expected"),
    [
        ("postgresql://u:p@h:5432/app", "t1", "postgresql://u:p@h:5432/t1"),
        ("postgresql://u@h/app?sslmode=disable", "t2", "postgresql://u@h/t2?sslmode=disable"),
        ("postgresql://h:1", "t3", "postgresql://h:1/t3"),
    ],
)
def test_with_database_swaps_only_the_database(url: str, database: str, expected: str) -> None:
    assert with_database(url, database) == expected


def test_docker_probe_is_off_when_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(infra.DOCKER_ENV, "0")
    infra.docker_engine_available.cache_clear()
    try:
        assert infra.docker_engine_available() is False
    finally:
        infra.docker_engine_available.cache_clear()


def test_docker_probe_does_not_hang_without_an_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(infra.DOCKER_ENV, raising=False)
    # a socket path where nothing listens: the ping must fail (quickly) rather than raise or hang
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    infra.docker_engine_available.cache_clear()
    try:
        assert infra.docker_engine_available() is False
    finally:
        infra.docker_engine_available.cache_clear()
