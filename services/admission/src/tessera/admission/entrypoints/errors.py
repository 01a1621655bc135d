"""Structured error bodies: every error the API returns is `{code, message, field, errors}`,
including FastAPI's own 404, 405 and request validation errors, and the runner's request limits
(400 for a NUL in the path or query, 413 over the body limit, 500 with a request id)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from tessera.contracts.base import FieldError
from tessera.contracts.validation import field_errors_of, printable


class ErrorBody(BaseModel):
    code: str
    message: str
    field: str | None = None
    job_id: str | None = None
    errors: list[FieldError] = []
    request_id: str | None = None


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field


def not_found(kind: str, name: str) -> ApiError:
    return ApiError(404, "not_found", f"no {kind} named {name!r}", None)


ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text}
    for status, text in {
        400: "a NUL character in the path or the query; `field` says where",
        401: "no or unknown bearer token",
        403: "the token's tenant may not do this",
        404: "not found",
        409: "conflicts with the current state",
        413: "the request body is over the limit (1 MiB unless configured)",
        422: "invalid input; `field` names the culprit",
        500: "an unexpected error; `request_id` identifies it in the service's log",
    }.items()
}

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    422: "invalid",
}


def _json(status: int, body: ErrorBody, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        errors = [FieldError(field=exc.field, reason=exc.message)] if exc.field else []
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return _json(
            exc.status, ErrorBody(code=exc.code, message=exc.message, field=exc.field, errors=errors), headers
        )

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        message = printable(exc.detail if isinstance(exc.detail, str) else str(exc.detail))
        code = _CODES.get(exc.status_code, "error")
        return _json(exc.status_code, ErrorBody(code=code, message=message), getattr(exc, "headers", None))

    async def validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        details = [{**e, "loc": tuple(p for p in e["loc"] if p != "body")} for e in exc.errors()]
        errors = [
            FieldError(field="body" if e.field == "(body)" else e.field, reason=e.reason)
            for e in field_errors_of(details)
        ]
        first = errors[0] if errors else None
        body = ErrorBody(
            code="invalid",
            message=f"{first.field}: {first.reason}" if first else "invalid request",
            field=first.field if first else None,
            errors=errors,
        )
        return _json(422, body)

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
