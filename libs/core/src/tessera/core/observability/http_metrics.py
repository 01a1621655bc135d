"""HTTP requests and their latency by route, on the service's registry.

Families:

- ``tessera_http_requests_total{method,route,status}``: requests answered;
- ``tessera_http_request_duration_seconds{method,route}`` (histogram): from the request to the end
  of its response.

``route`` is the route's template (``/v1/jobs/{job_id}``), never the path itself, so a label cannot
grow with ids; a request no route matched (a 404, or one the request limits answered before
routing) counts as ``unmatched``. The middleware finds the service's registry on the app's state
(``app.state.ctx.metrics``, set when the service has started); before that it only passes requests on.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED = "unmatched"
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class HttpMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "tessera_http_requests_total",
            "HTTP requests answered, by method, route template and status",
            ["method", "route", "status"],
            registry=registry,
        )
        self.seconds = Histogram(
            "tessera_http_request_duration_seconds",
            "Time from an HTTP request to the end of its response, by method and route template",
            ["method", "route"],
            buckets=BUCKETS,
            registry=registry,
        )

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.seconds.labels(method, route).observe(seconds)


def route_of(scope: Scope) -> str:
    """The template of the route that served the request (FastAPI puts it in the scope)."""
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path else UNMATCHED


def _metrics_of(scope: Scope) -> HttpMetrics | None:
    app = scope.get("app")
    ctx = getattr(getattr(app, "state", None), "ctx", None)
    metrics = getattr(ctx, "metrics", None)
    http = getattr(metrics, "http", None)
    return http if isinstance(http, HttpMetrics) else None


class HttpMetricsMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client gets when the app fails before it answers

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            metrics = _metrics_of(scope)
            if metrics is not None:
                metrics.observe(
                    scope.get("method", ""), route_of(scope), status, time.perf_counter() - started
                )
