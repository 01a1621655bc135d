"""Which failures are the message's own fault, and can never go away by trying again.

A consumer dead-letters such a message at once instead of spending its deliveries on it, and the
relay moves such an outbox row aside. Everything else (the database or NATS away, a timeout, a lock)
is transient and retried with backoff."""

from __future__ import annotations

from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError, StatementError

from tessera.core.messaging.envelope import EnvelopeError
from tessera.core.messaging.limits import MessageTooLarge


class PermanentError(Exception):
    """The message can never be handled; it goes to the dead-letter subject at once."""


#: SQLSTATE class 22, "data exception": a value too long for its column, a number out of range, a
#: NUL byte or a bad escape in text or JSON. The same row fails the same way every time.
DATA_EXCEPTION_CLASS = "22"

_PERMANENT_TYPES: tuple[type[BaseException], ...] = (
    PermanentError,
    EnvelopeError,
    ValidationError,
    MessageTooLarge,
    UnicodeError,
    OverflowError,
    RecursionError,
)


def sqlstate(exc: BaseException) -> str:
    """The SQLSTATE of a database error (through SQLAlchemy's wrapper), or ''."""
    original = getattr(exc, "orig", None)
    for candidate in (exc, original, getattr(original, "__cause__", None)):
        code = getattr(candidate, "sqlstate", None) or getattr(candidate, "pgcode", None)
        if isinstance(code, str) and code:
            return code
    return ""


def is_permanent(exc: BaseException) -> bool:
    """True for a wrong type, an overflow, an undecodable or oversized message, a value the database
    refuses as data, or a handler's own `PermanentError`."""
    if isinstance(exc, _PERMANENT_TYPES):
        return True
    if isinstance(exc, DBAPIError):
        if sqlstate(exc).startswith(DATA_EXCEPTION_CLASS):
            return True
        # asyncpg refuses to encode a value before sending it (a lone surrogate, a str for an int)
        return _refused_by_driver(getattr(exc.orig, "__cause__", None))
    if isinstance(exc, StatementError):  # a value SQLAlchemy could not even bind (a wrong type)
        return isinstance(exc.orig, (*_PERMANENT_TYPES, TypeError))
    return False


def _refused_by_driver(cause: BaseException | None) -> bool:
    if cause is None:
        return False
    if isinstance(cause, _PERMANENT_TYPES):
        return True
    return type(cause).__name__ == "DataError" and isinstance(cause, ValueError)


def describe(exc: BaseException) -> str:
    """A one-line reason for a dead letter: the error's type and its first line."""
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first_line}"[:500]
