"""ASGI middleware giving every HTTP request a trace id for its log lines."""

from __future__ import annotations

import uuid
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from tessera.core.observability.logs import trace_id_from_headers, trace_id_var


class TraceIdMiddleware:
    """Log lines written while a request is served carry `trace_id`: the caller's, from its
    `traceparent` header, or a new one; spans the request opens take precedence in the line."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[str, Any] = {
            key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope.get("headers", [])
        }
        token = trace_id_var.set(trace_id_from_headers(headers) or uuid.uuid4().hex)
        try:
            await self.app(scope, receive, send)
        finally:
            trace_id_var.reset(token)
