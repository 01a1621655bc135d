"""ASGI middleware every service's app runs behind: a request body limit (413), no NUL in the path
or the query (400, naming where), and an unexpected error answered as JSON 500 with the request id.

Bodies follow the API's error shape `{code, message, field, errors}`. The 500 is sent here and the
error is not re-raised: the server would otherwise close the connection (a reset keep-alive) for a
response that is already complete. Requests are counted as they stream, so a body with no (or a
false) Content-Length is cut at the limit too."""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import parse_qsl

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tessera.core.observability.logs import log_trace_id

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 1024 * 1024


class BodyTooLarge(HTTPException):
    """Raised from `receive` once a body passes the limit. An HTTPException, so a framework that
    wraps body-parsing errors (FastAPI answers them 400) passes it on as the 413 it is."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body exceeds the limit of {limit} bytes")


def _error(code: str, message: str, field: str | None = None, **extra: Any) -> bytes:
    errors = [{"field": field, "reason": message}] if field else []
    body = {"code": code, "message": message, "field": field, "errors": errors, **extra}
    return json.dumps(body).encode("utf-8")


async def _respond(
    send: Send, status: int, body: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def nul_in_request(scope: Scope) -> str | None:
    """Where the request carries a NUL character (`path` or `query.<name>`), or None. Databases
    refuse NUL in text, so it is refused before any handler sees it."""
    if "\x00" in scope.get("path", ""):
        return "path"
    query = scope.get("query_string", b"").decode("latin-1")
    for name, value in parse_qsl(query, keep_blank_values=True):
        if "\x00" in name or "\x00" in value:
            return f"query.{name.replace(chr(0), '%00')}"
    return None


class RequestLimitsMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        where = nul_in_request(scope)
        if where is not None:
            message = f"{where} must not contain a NUL character"
            await _respond(send, 400, _error("bad_request", message, where))
            return
        limit = self.max_body_bytes
        declared = dict(scope.get("headers", [])).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await _respond(send, 413, _error("too_large", BodyTooLarge(limit).detail, "body"))
            return

        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except BodyTooLarge as exc:
            if started:
                raise
            await _respond(send, 413, _error("too_large", exc.detail, "body"))
        except Exception:
            request_id = log_trace_id()
            log.exception(
                "unexpected error serving %s %s",
                scope.get("method", ""),
                scope.get("path", "").encode("utf-8", "backslashreplace").decode(),
                extra={"request_id": request_id},
            )
            if started:
                raise  # the response is under way: nothing better can be sent
            message = f"an unexpected error; quote request id {request_id} to the operator"
            body = _error("internal", message, None, request_id=request_id)
            await _respond(send, 500, body, ((b"x-request-id", request_id.encode("latin-1")),))
