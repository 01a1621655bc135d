"""Telemetry's logging: routine polls out of the INFO log, repeated failures at most once per interval.

Telemetry polls its GPU source (the devcluster's NVML endpoints, dcgm-exporter) every sample
interval; httpx writes an INFO line for every request, so the log was mostly `HTTP Request: GET
.../nvml/gpu-node-0 "HTTP/1.1 200 OK"`. Those lines become DEBUG (shown when the service's log
level is DEBUG). A failed poll is not one of them: the source raises `SourceUnavailable` and the
sampler logs it, through `failures`, once per `FAILURE_LOG_INTERVAL_S` with a count of the lines
left out.
"""

from __future__ import annotations

import logging

from tessera.core.observability.ratelimit import RateLimitedLog

FAILURE_LOG_INTERVAL_S = 30.0
HTTP_LOGGERS = ("httpx",)


class DemoteToDebug(logging.Filter):
    """Logs an INFO record of its logger as DEBUG: passed on only when DEBUG is enabled."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO:
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def quiet_http_polls() -> None:
    """Every request line of the HTTP client at DEBUG, not INFO (once per process)."""
    for name in HTTP_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, DemoteToDebug) for f in logger.filters):
            logger.addFilter(DemoteToDebug())


def failure_log(logger: logging.Logger, interval_s: float = FAILURE_LOG_INTERVAL_S) -> RateLimitedLog:
    """Failures that repeat every round (a source away, the database down), rate limited per key."""
    return RateLimitedLog(logger, interval_s)
