from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from tessera.contracts.events import JobAccepted
from tessera.core.messaging.envelope import MSG_ID, EnvelopeError, decode, encode


def test_encode_puts_cloudevents_attributes_in_headers_and_the_body_in_json() -> None:
    event = JobAccepted(job_id="j1", name="train", tenant="t", queue="q")
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    subject, headers, body = encode(
        event,
        "tessera/admission",
        event_id="e1",
        time=at,
        trace_headers={"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"},
    )
    assert subject == "tessera.admission.evt.job_accepted"
    assert headers["ce-specversion"] == "1.0"
    assert headers["ce-id"] == headers[MSG_ID] == "e1"
    assert headers["ce-type"] == "io.tessera.admission.job_accepted.v1"
    assert headers["ce-subject"] == "j1"
    assert headers["ce-time"] == at.isoformat()
    assert headers["traceparent"].startswith("00-aaaa")
    assert json.loads(body) == {"job_id": "j1", "name": "train", "tenant": "t", "queue": "q"}


def test_decode_round_trips_and_parses_to_the_contract_type() -> None:
    event = JobAccepted(job_id="j1", name="train", tenant="t", queue="q")
    subject, headers, body = encode(event, "src")
    envelope = decode(subject, headers, body)
    assert envelope.parse() == event
    assert envelope.parse() is envelope.parse(), "validated once: the handler reuses the intake's parse"
    assert envelope == decode(subject, headers, body), "the cached parse is not part of equality"
    assert envelope.subject == "j1"
    assert envelope.trace_headers == {}


@pytest.mark.parametrize(
    ("headers", "body", "reason"),
    [
        ({}, b"{}", "missing CloudEvents headers"),
        (
            {"ce-id": "1", "ce-source": "s", "ce-type": "t", "ce-time": "2026-01-01T00:00:00+00:00"},
            b"{nope",
            "not JSON",
        ),
        ({"ce-id": "1", "ce-source": "s", "ce-type": "t", "ce-time": "yesterday"}, b"{}", "RFC 3339"),
        (
            {"ce-id": "1", "ce-source": "s", "ce-type": "t", "ce-time": "2026-01-01T00:00:00+00:00"},
            b"[1]",
            "JSON object",
        ),
    ],
)
def test_decode_rejects_what_can_never_be_handled(headers: dict[str, str], body: bytes, reason: str) -> None:
    with pytest.raises(EnvelopeError, match=reason):
        decode("x", headers, body)


def test_parse_rejects_unknown_types_and_bodies_that_break_the_schema() -> None:
    _, headers, _ = encode(JobAccepted(job_id="j", name="n", tenant="t", queue="q"), "s")
    with pytest.raises(EnvelopeError, match="does not match"):
        decode("x", headers, b'{"job_id": "j"}').parse()
    with pytest.raises(EnvelopeError, match="unknown type"):
        decode("x", {**headers, "ce-type": "io.example.other.v1"}, b"{}").parse()
