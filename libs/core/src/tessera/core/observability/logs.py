"""Structured JSON logs carrying the trace id and the job id.

Inside a handled message or an HTTP request every log line carries `trace_id`: the current span's,
or else the one the message or request brought (`trace_id_var`, set by the consumer and the runner's
HTTP middleware); `TraceIdFilter` puts it on the record, so any formatter can print it."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from tessera.core.observability.tracing import current_trace_id

job_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("job_id", default="")
trace_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("trace_id", default="")
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def trace_id_from_headers(headers: Mapping[str, str] | None) -> str:
    """The trace id of a W3C `traceparent` header (`00-<32 hex>-<16 hex>-<2 hex>`), or ''."""
    parts = (headers or {}).get("traceparent", "").strip().split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or parts[1] == "0" * 32:
        return ""
    try:
        int(parts[1], 16)
    except ValueError:
        return ""
    return parts[1].lower()


def log_trace_id() -> str:
    """The trace id a log line written now belongs to: the current span's, else the context's."""
    return current_trace_id() or trace_id_var.get()


class TraceIdFilter(logging.Filter):
    """Adds `trace_id` (and `job_id`) to every record written inside a message or a request."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "trace_id", None):
            trace_id = log_trace_id()
            if trace_id:
                record.trace_id = trace_id
        if not getattr(record, "job_id", None):
            job_id = job_id_var.get()
            if job_id:
                record.job_id = job_id
        return True


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        trace_id = getattr(record, "trace_id", None) or log_trace_id()
        if trace_id:
            entry["trace_id"] = trace_id
        job_id = getattr(record, "job_id", None) or job_id_var.get()
        if job_id:
            entry["job_id"] = job_id
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in entry:
                entry[key] = value if isinstance(value, str | int | float | bool | None) else str(value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(service: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter(service))
    handler.addFilter(TraceIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "nats", "sqlalchemy.engine"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
