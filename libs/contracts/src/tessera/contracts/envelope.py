"""CloudEvents 1.0 in binary mode over NATS: attributes as `ce-*` headers, the body as JSON.

Pure (pydantic and the standard library), so that clients such as the checkpoint client speak the
envelope without the service runtime; `tessera.core.messaging.envelope` re-exports it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from tessera.contracts.base import Message
from tessera.contracts.events import BY_TYPE

SPEC_VERSION = "1.0"
MSG_ID = "Nats-Msg-Id"
TRACE_HEADERS = ("traceparent", "tracestate")


class EnvelopeError(ValueError):
    """A message that can never be handled: missing attributes, bad JSON, or a body that fails its schema."""


@dataclass(frozen=True)
class Envelope:
    id: str
    source: str
    type: str
    time: datetime
    subject: str
    data: dict[str, Any]
    nats_subject: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    #: the body once validated: the consumer validates at intake, and the handler's parse reuses it
    _parsed: Message | None = field(default=None, init=False, repr=False, compare=False)

    def parse(self) -> Message:
        """The body as its contract type, validated (once: later calls return the same message)."""
        if self._parsed is not None:
            return self._parsed
        model = BY_TYPE.get(self.type)
        if model is None:
            raise EnvelopeError(f"unknown type {self.type!r}")
        try:
            parsed = model.model_validate(self.data)
        except ValidationError as exc:
            raise EnvelopeError(f"body does not match {self.type}: {exc.errors()[:3]}") from exc
        object.__setattr__(self, "_parsed", parsed)  # a cache on a frozen envelope
        return parsed

    @property
    def trace_headers(self) -> dict[str, str]:
        return {k: v for k, v in self.headers.items() if k in TRACE_HEADERS}


def encode(
    message: Message,
    source: str,
    *,
    event_id: str | None = None,
    trace_headers: Mapping[str, str] | None = None,
    time: datetime | None = None,
) -> tuple[str, dict[str, str], bytes]:
    """(nats subject, headers, body) for one message."""
    event_id = event_id or str(uuid.uuid4())
    headers = {
        "ce-specversion": SPEC_VERSION,
        "ce-id": event_id,
        "ce-source": source,
        "ce-type": message.TYPE,
        "ce-time": (time or datetime.now(UTC)).isoformat(),
        "content-type": "application/json",
        MSG_ID: event_id,
    }
    if message.key():
        headers["ce-subject"] = message.key()
    headers.update(trace_headers or {})
    return message.subject(), headers, message.model_dump_json().encode()


def decode(nats_subject: str, headers: Mapping[str, str] | None, body: bytes) -> Envelope:
    headers = dict(headers or {})
    missing = [h for h in ("ce-id", "ce-source", "ce-type", "ce-time") if not headers.get(h)]
    if missing:
        raise EnvelopeError(f"missing CloudEvents headers: {', '.join(missing)}")
    if headers.get("ce-specversion", SPEC_VERSION) != SPEC_VERSION:
        raise EnvelopeError(f"unsupported ce-specversion {headers['ce-specversion']!r}")
    try:
        data = json.loads(body or b"{}")
    except json.JSONDecodeError as exc:
        raise EnvelopeError(f"body is not JSON: {exc.msg} at position {exc.pos}") from exc
    if not isinstance(data, dict):
        raise EnvelopeError("body must be a JSON object")
    try:
        time = datetime.fromisoformat(headers["ce-time"])
    except ValueError as exc:
        raise EnvelopeError(f"ce-time {headers['ce-time']!r} is not an RFC 3339 time") from exc
    return Envelope(
        id=headers["ce-id"],
        source=headers["ce-source"],
        type=headers["ce-type"],
        time=time,
        subject=headers.get("ce-subject", ""),
        data=data,
        nats_subject=nats_subject,
        headers=headers,
    )
