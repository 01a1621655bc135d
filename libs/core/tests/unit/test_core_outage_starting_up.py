"""A PostgreSQL replaying its WAL after a crash refuses connections with SQLSTATE 57P03 ("the database
system is starting up"): that is an outage, answered JSON 503 with Retry-After, not a 500.

The server here speaks just enough of PostgreSQL's wire protocol to refuse a connection the way a
recovering server does; asyncpg and SQLAlchemy raise what they raise against the real thing."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tessera.core.outage import answer_outages_with_503, is_database_outage


def _error_response(sqlstate: str, message: str) -> bytes:
    fields = (
        b"".join(
            code + value.encode() + b"\0"
            for code, value in ((b"S", "FATAL"), (b"V", "FATAL"), (b"C", sqlstate), (b"M", message))
        )
        + b"\0"
    )
    return b"E" + struct.pack("!i", len(fields) + 4) + fields


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers SSLRequest with 'N', then the startup message with a FATAL 57P03, as PostgreSQL does."""
    try:
        while True:
            length = struct.unpack("!i", await reader.readexactly(4))[0]
            code = struct.unpack("!i", await reader.readexactly(4))[0]
            await reader.readexactly(length - 8)
            if code == 80877103:  # SSLRequest
                writer.write(b"N")
                await writer.drain()
                continue
            writer.write(_error_response("57P03", "the database system is starting up"))
            await writer.drain()
            return
    except (asyncio.IncompleteReadError, ConnectionError):
        return
    finally:
        writer.close()


@pytest.fixture
async def starting_up_url() -> AsyncIterator[str]:
    server = await asyncio.start_server(_refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"postgresql+asyncpg://tessera:secret@127.0.0.1:{port}/tessera"


async def test_asyncpg_starting_up_is_an_outage(starting_up_url: str) -> None:
    with pytest.raises(asyncpg.CannotConnectNowError) as raised:
        await asyncpg.connect(starting_up_url.replace("+asyncpg", ""), ssl=False)
    assert is_database_outage(raised.value)


async def test_sqlalchemy_starting_up_is_an_outage(starting_up_url: str) -> None:
    engine = create_async_engine(starting_up_url, connect_args={"ssl": False})
    try:
        with pytest.raises(Exception) as raised:
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        assert is_database_outage(raised.value), repr(raised.value)
    finally:
        await engine.dispose()


async def test_the_api_answers_json_503_while_the_database_starts_up(starting_up_url: str) -> None:
    engine = create_async_engine(starting_up_url, connect_args={"ssl": False})
    app = FastAPI()
    answer_outages_with_503(app)

    @app.get("/v1/now")
    async def now() -> dict[str, str]:
        async with engine.connect() as conn:
            return {"now": str((await conn.execute(text("SELECT now()"))).scalar_one())}

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
            reply = await client.get("/v1/now")
    finally:
        await engine.dispose()
    assert reply.status_code == 503, reply.text
    assert reply.headers["content-type"] == "application/json"
    assert reply.json()["code"] == "unavailable"
    assert int(reply.headers["Retry-After"]) > 0


def test_a_statement_the_server_refused_is_not_an_outage() -> None:
    assert not is_database_outage(asyncpg.UniqueViolationError("duplicate key"))
