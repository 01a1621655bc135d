"""PostgreSQL killed in the middle of a statement can leave asyncpg's protocol mid-operation: every
later statement on that connection fails with "cannot switch to state N; another operation (M) is in
progress" (the chaos soak saw it in admission's relay and workload sync and in the scheduler at each
PostgreSQL kill). That is a broken connection, to be invalidated as a disconnect, not a bug."""

from __future__ import annotations

from asyncpg.exceptions import InternalClientError, UniqueViolationError
from sqlalchemy.exc import InternalError

from tessera.core.db.engine import is_broken_protocol

MESSAGE = "cannot switch to state 12; another operation (2) is in progress"


def test_asyncpgs_mid_operation_protocol_is_broken() -> None:
    assert is_broken_protocol(InternalClientError(MESSAGE))


def test_under_sqlalchemys_wrapper_too() -> None:
    adapted = RuntimeError(MESSAGE)  # the dialect's adapted error, raised from asyncpg's
    adapted.__cause__ = InternalClientError(MESSAGE)
    assert is_broken_protocol(InternalError("SELECT 1", {}, adapted))


def test_other_errors_are_not() -> None:
    assert not is_broken_protocol(InternalClientError("some other client error"))
    assert not is_broken_protocol(UniqueViolationError("duplicate key"))
    assert not is_broken_protocol(None)
