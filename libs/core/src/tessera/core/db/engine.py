"""The async engine, built in bootstrap and never at import."""

from __future__ import annotations

import time
from typing import Any

from asyncpg.exceptions import InternalClientError
from sqlalchemy import event
from sqlalchemy.engine import ExceptionContext, make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine


def async_url(url: str) -> str:
    """`postgresql://…` as users write it -> the asyncpg dialect SQLAlchemy needs."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg2", "postgresql+psycopg"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    return parsed.render_as_string(hide_password=False)


def sync_url(url: str) -> str:
    """The same database for the sync code paths (Alembic runs async too, so this is for display)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


#: a pooled connection idle for longer than this is pinged when it is checked out; a busy one is not
PING_IDLE_S = 1.0
#: prepared statements kept per connection: a consumer's batch names one savepoint per message
#: (`sa_savepoint_N`), so the default 100 would prepare them again on every batch larger than 50
PREPARED_STATEMENT_CACHE = 1024


def make_engine(url: str, *, pool_size: int = 10, application_name: str = "tessera") -> AsyncEngine:
    engine = create_async_engine(
        async_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        connect_args={
            "server_settings": {"application_name": application_name},
            "prepared_statement_cache_size": PREPARED_STATEMENT_CACHE,
        },
    )
    check_liveness_on_checkout(engine)
    invalidate_broken_protocols(engine)
    return engine


def is_broken_protocol(exc: BaseException | None) -> bool:
    """asyncpg's "cannot switch to state N; another operation (M) is in progress": the server went
    away in the middle of a statement and the driver's protocol is left mid-operation. The connection
    can never run another statement, yet the error is not one SQLAlchemy takes for a disconnect."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, InternalClientError) and "another operation" in str(exc):
            return True
        exc = getattr(exc, "orig", None) or exc.__cause__
    return False


def invalidate_broken_protocols(engine: AsyncEngine) -> None:
    """A connection whose protocol broke (`is_broken_protocol`) is a disconnect: SQLAlchemy
    invalidates it and the pool, instead of pooling it again for the next statement to fail on, and
    the error reads as a database outage (a 503, a held batch), not as a bug."""

    @event.listens_for(engine.sync_engine, "handle_error")
    def _broken_is_disconnect(context: ExceptionContext) -> None:
        if is_broken_protocol(context.original_exception):
            context.is_disconnect = True


def check_liveness_on_checkout(engine: AsyncEngine, *, ping_idle_s: float = PING_IDLE_S) -> None:
    """Hand out only live connections, for less than `pool_pre_ping` costs.

    `pool_pre_ping` spends three round trips (BEGIN, a ping, ROLLBACK) on every checkout, as many as a
    whole one-statement transaction. Instead: a connection the server closed while it sat in the pool
    (a restart, a terminated backend) is seen closed by the driver, since the event loop reads its
    EOF, and is replaced without a round trip; one idle for more than `ping_idle_s` (time enough
    for a server to have gone away unseen) is pinged as before. A connection that still fails in use
    raises a disconnect error, on which SQLAlchemy invalidates the pool."""
    pool = engine.sync_engine.pool

    @event.listens_for(pool, "checkin")
    def _idle_from(dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(pool, "checkout")
    def _alive(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        driver = getattr(dbapi_connection, "driver_connection", None)
        if driver is not None and driver.is_closed():
            raise DisconnectionError("the connection was closed while it was pooled")
        idle_since = record.info.get("idle_since")
        if idle_since is not None and time.monotonic() - idle_since > ping_idle_s:
            try:
                engine.dialect.do_ping(dbapi_connection)
            except Exception as exc:
                raise DisconnectionError(f"the connection failed its ping: {exc!r}") from exc


def make_session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)
