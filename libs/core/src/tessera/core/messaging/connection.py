"""The NATS connection every service holds: it reconnects for ever and says so.

The URL may carry the service's user and password (``nats://user:password@host:port``); logs name
the server without them."""

from __future__ import annotations

import logging
from urllib.parse import urlsplit, urlunsplit

import nats
from nats.aio.client import Client as NATS

from tessera.core.observability.metrics import Metrics
from tessera.core.observability.ratelimit import RateLimitedLog

log = logging.getLogger(__name__)


async def connect_nats(
    url: str,
    name: str,
    metrics: Metrics | None = None,
    *,
    reconnect_wait_s: float = 1.0,
    ping_interval_s: float = 10.0,
    inbox_prefix: str | None = None,
) -> NATS:
    """A connection that reconnects for ever, `reconnect_wait_s` apart, and says so in the logs and
    the metrics. It can still close for good (the server refused something it sent, say): the
    runner's liveness check then fails, so the service is restarted rather than left deaf.
    ``inbox_prefix``: where replies come (a user allowed replies on its own prefix only needs it)."""
    events = metrics.nats_connection_events if metrics is not None else None
    connected = metrics.nats_connected if metrics is not None else None
    errors = RateLimitedLog(log, interval_s=10.0)
    server = redact(url)

    async def on_error(exc: Exception) -> None:
        errors.warning(f"nats:{type(exc).__name__}", "nats error", extra={"error": repr(exc)})
        if events is not None:
            events.labels("error").inc()

    async def on_disconnected() -> None:
        log.warning("nats disconnected; reconnecting", extra={"nats_url": server})
        if events is not None and connected is not None:
            events.labels("disconnected").inc()
            connected.set(0)

    async def on_reconnected() -> None:
        log.info("nats reconnected", extra={"nats_url": server})
        if events is not None and connected is not None:
            events.labels("reconnected").inc()
            connected.set(1)

    async def on_closed() -> None:
        log.warning("nats connection closed", extra={"nats_url": server})
        if events is not None and connected is not None:
            events.labels("closed").inc()
            connected.set(0)

    nc = await nats.connect(
        url,
        name=name,
        allow_reconnect=True,
        max_reconnect_attempts=-1,
        reconnect_time_wait=reconnect_wait_s,  # type: ignore[arg-type]  # nats.py annotates int, takes float
        ping_interval=ping_interval_s,  # type: ignore[arg-type]
        max_outstanding_pings=2,
        connect_timeout=5,
        error_cb=on_error,
        disconnected_cb=on_disconnected,
        reconnected_cb=on_reconnected,
        closed_cb=on_closed,
        **({"inbox_prefix": inbox_prefix} if inbox_prefix else {}),
    )
    if connected is not None:
        connected.set(1)
    return nc


def redact(url: str) -> str:
    """``url`` without the user and password it may carry (each server of a comma-separated list)."""
    parts = []
    for one in url.split(","):
        split = urlsplit(one.strip())
        host = split.netloc.rpartition("@")[2]
        parts.append(urlunsplit((split.scheme, host, split.path, split.query, split.fragment)))
    return ",".join(parts)
