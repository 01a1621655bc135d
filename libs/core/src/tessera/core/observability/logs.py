"""Structured JSON logs carrying the trace id and the job id."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from tessera.core.observability.tracing import current_trace_id

job_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("job_id", default="")
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


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
        trace_id = current_trace_id()
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
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "nats", "sqlalchemy.engine"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
