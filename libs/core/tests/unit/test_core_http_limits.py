"""The limits every service's app runs behind: 413 over the body limit (declared or streamed),
400 naming where a NUL is, and an unexpected error as JSON 500 with a request id, on a connection
that stays open."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import Body, FastAPI

from tessera.core.observability.http import TraceIdMiddleware
from tessera.core.observability.http_limits import RequestLimitsMiddleware

LIMIT = 2048


def make_app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(body: dict[str, Any] = Body()) -> dict[str, Any]:
        return {"keys": len(body)}

    @app.get("/items/{item}")
    async def item(item: str, tag: str = "") -> dict[str, str]:
        return {"item": item, "tag": tag}

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    app.add_middleware(RequestLimitsMiddleware, max_body_bytes=LIMIT)
    app.add_middleware(TraceIdMiddleware)
    return app


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=make_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://svc") as c:
        yield c


async def test_a_body_within_the_limit_is_served(client: httpx.AsyncClient) -> None:
    response = await client.post("/echo", json={"a": "x" * (LIMIT - 100)})
    assert (response.status_code, response.json()) == (200, {"keys": 1})


async def test_a_declared_body_over_the_limit_is_refused_413(client: httpx.AsyncClient) -> None:
    response = await client.post("/echo", json={"a": "x" * LIMIT})
    assert response.status_code == 413
    body = response.json()
    assert (body["code"], body["field"]) == ("too_large", "body")
    assert f"limit of {LIMIT} bytes" in body["message"]


async def test_a_streamed_body_over_the_limit_is_refused_413(client: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"a": "'
        for _ in range(4):
            yield b"x" * 1000
        yield b'"}'

    response = await client.post("/echo", content=chunks(), headers={"content-type": "application/json"})
    # raised while the framework reads the body: the app's HTTP error handler writes the 413
    assert response.status_code == 413
    assert f"limit of {LIMIT} bytes" in response.text


@pytest.mark.parametrize(
    ("url", "where"),
    [("/items/a%00b", "path"), ("/items/a?tag=%00", "query.tag"), ("/items/a?x%00=1", "query.x%00")],
)
async def test_a_nul_in_the_path_or_query_is_refused_naming_where(
    client: httpx.AsyncClient, url: str, where: str
) -> None:
    response = await client.get(url)
    assert response.status_code == 400
    assert (response.json()["code"], response.json()["field"]) == ("bad_request", where)
    ok = await client.get("/items/a?tag=b%20c")
    assert ok.json() == {"item": "a", "tag": "b c"}


async def test_an_unexpected_error_is_json_500_with_the_request_id(client: httpx.AsyncClient) -> None:
    trace = "0af7651916cd43dd8448eb211c80319c"
    response = await client.get("/boom", headers={"traceparent": f"00-{trace}-b7ad6b7169203331-01"})
    assert response.status_code == 500
    body = response.json()
    assert (body["code"], body["request_id"]) == ("internal", trace)
    assert response.headers["x-request-id"] == trace
    assert trace in body["message"]


@pytest.fixture
def live_port() -> Iterator[int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(make_app(), host="127.0.0.1", port=port, log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    started = threading.Event()
    for _ in range(200):
        if server.started:
            started.set()
            break
        started.wait(0.025)
    assert server.started, "the test server did not start"
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


def test_the_connection_stays_open_after_a_500(live_port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", live_port, timeout=10)
    conn.auto_open = 0  # a closed connection must fail here, not be reopened quietly
    try:
        conn.connect()
        first_socket = conn.sock
        conn.request("GET", "/boom")
        failed = conn.getresponse()
        assert failed.status == 500 and json.loads(failed.read())["code"] == "internal"
        conn.request("GET", "/items/again")
        again = conn.getresponse()
        assert again.status == 200 and json.loads(again.read())["item"] == "again"
        assert conn.sock is first_socket
    finally:
        conn.close()
