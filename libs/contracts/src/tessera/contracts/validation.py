"""Turn pydantic's errors into field paths and reasons a person can act on."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from tessera.contracts.base import FieldError
from tessera.contracts.jobs import DNS_LABEL, JobSpec

_FRIENDLY = {
    "string_pattern_mismatch": "must be a DNS label: lower-case letters, digits and '-', "
    "starting and ending with a letter or digit",
    "extra_forbidden": "is not a known field",
    "missing": "is required",
}


def printable(text: str) -> str:
    """``text`` with NUL, other control characters and lone surrogates escaped, so it can be
    written back in a UTF-8 error body or a log line (a field path can hold a user's key)."""
    if text.isprintable():
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return (
        "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
        .encode("utf-8", "backslashreplace")
        .decode("utf-8")
    )


def field_path(loc: Sequence[int | str], prefix: str = "") -> str:
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            part = printable(str(part))
            path = f"{path}.{part}" if path else part
    return path or "(body)"


def field_errors(exc: ValidationError, prefix: str = "") -> list[FieldError]:
    return field_errors_of(exc.errors(), prefix)


def field_errors_of(details: Iterable[Mapping[str, Any]], prefix: str = "") -> list[FieldError]:
    """Pydantic's error details (of a ValidationError, or of a framework that validated a request)
    as field paths and reasons."""
    errors = []
    for err in details:
        reason = printable(err["msg"].removeprefix("Value error, "))
        ctx: dict[str, Any] = err.get("ctx") or {}
        if err["type"] in _FRIENDLY and (
            err["type"] != "string_pattern_mismatch" or ctx.get("pattern") == DNS_LABEL
        ):
            reason = _FRIENDLY[err["type"]]
        errors.append(FieldError(field=field_path(err["loc"], prefix), reason=reason))
    return errors


def parse_job_spec(data: object) -> tuple[JobSpec | None, list[FieldError]]:
    """Validate a job spec; returns the spec, or the list of field errors."""
    try:
        return JobSpec.model_validate(data), []
    except ValidationError as exc:
        return None, field_errors(exc)
