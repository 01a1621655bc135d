"""A request that needs the database while it cannot be reached is answered 503, in JSON, with
``Retry-After``, rather than a plain-text 500: the client may retry, and the service stays up (its
readiness already says the database is down, and its pool reconnects when the server is back)."""

from __future__ import annotations

from asyncpg.exceptions import PostgresError
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

#: seconds a client is asked to wait: about what an embedded PostgreSQL needs to come back
RETRY_AFTER_S = 5

#: SQLSTATEs of a server that cannot take the connection or the statement yet: class 08 (connection
#: exception) and 57P01-57P03 (shut down by an administrator, after a crash, still starting up)
_OUTAGE_SQLSTATE_CLASSES = ("08",)
_OUTAGE_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})


def _sqlstate_says_outage(exc: BaseException) -> bool:
    """asyncpg's error, raw (a connect through the pool's checkout) or under SQLAlchemy's wrapper."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        state = getattr(current, "sqlstate", None)
        if isinstance(state, str) and (
            state in _OUTAGE_SQLSTATES or state.startswith(_OUTAGE_SQLSTATE_CLASSES)
        ):
            return True
        current = getattr(current, "orig", None) or current.__cause__
    return False


def is_database_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot be reached (refused, reset, starting up, the
    connection gone, no pooled connection in time), as opposed to a statement it refused."""
    if _sqlstate_says_outage(exc):
        return True
    if isinstance(exc, (OperationalError, InterfaceError, PoolTimeout)):
        return True
    if isinstance(exc, DBAPIError):
        return bool(exc.connection_invalidated)
    # asyncpg's refused connect reaches us unwrapped, through the pool's checkout
    return isinstance(exc, ConnectionError)


def unavailable(message: str = "the database is unavailable; retry shortly") -> JSONResponse:
    return JSONResponse(
        {"code": "unavailable", "message": message},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


async def _database_outage(request: Request, exc: Exception) -> JSONResponse:
    if is_database_outage(exc):
        return unavailable()
    raise exc  # not an outage: the app's unexpected-error answer (a JSON 500 with a request id)


def answer_outages_with_503(app: FastAPI) -> None:
    """Register the handlers on ``app``; any other error goes on to the app's own handling."""
    for error in (DBAPIError, PoolTimeout, ConnectionError, PostgresError):
        app.add_exception_handler(error, _database_outage)
