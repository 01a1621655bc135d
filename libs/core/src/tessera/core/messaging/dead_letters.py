"""The dead-letter copy of a consumed message: the original headers and body with the reason, cut to
fit the server's size limit, and always naming the stream and sequence the original still lies at."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tessera.core.messaging.envelope import MSG_ID, Envelope
from tessera.core.messaging.limits import (
    ORIGINAL_SEQUENCE,
    ORIGINAL_STREAM,
    fit_body,
    header_bytes,
)

REASON = "tessera-dlq-reason"
ORIGINAL_SUBJECT = "tessera-dlq-original-subject"
CONSUMER = "tessera-dlq-consumer"
DELIVERIES = "tessera-dlq-deliveries"

#: headers kept when the original headers alone would crowd out the body
_ESSENTIAL_PREFIXES = ("ce-", "traceparent", "tracestate", "content-type")
_MAX_KEPT_HEADER_VALUE = 256


@dataclass(frozen=True)
class DeadLetter:
    """What a consumer's `on_dead_letter` hook learns about a message it could never handle."""

    consumer: str
    message_id: str
    headers: Mapping[str, str]
    envelope: Envelope | None
    """None when the message could not be decoded, or was too large to try."""
    kind: str
    """permanent, exhausted, undecodable or too_large"""
    reason: str


def original_id(headers: Mapping[str, str], stream_sequence: int) -> str:
    return headers.get(MSG_ID) or headers.get("ce-id") or f"seq-{stream_sequence}"


def dead_letter_copy(
    *,
    headers: Mapping[str, str] | None,
    body: bytes,
    subject: str,
    consumer: str,
    reason: str,
    deliveries: int,
    stream: str,
    stream_sequence: int,
    limit: int,
) -> tuple[dict[str, str], bytes]:
    """(headers, body) of the dead-letter copy, no larger than `limit` on the wire."""
    original = dict(headers or {})
    if header_bytes(original) > limit // 4:  # headers this large would leave no room for the body
        original = {
            key: value[:_MAX_KEPT_HEADER_VALUE]
            for key, value in original.items()
            if key.lower().startswith(_ESSENTIAL_PREFIXES) or key == MSG_ID
        }
    copy = {
        **original,
        REASON: reason[:1000],
        ORIGINAL_SUBJECT: subject[:255],
        CONSUMER: consumer,
        DELIVERIES: str(deliveries),
        ORIGINAL_STREAM: stream,
        ORIGINAL_SEQUENCE: str(stream_sequence),
        MSG_ID: f"dlq-{consumer}-{original_id(original, stream_sequence)[:128]}",
    }
    return fit_body(copy, body, limit)
