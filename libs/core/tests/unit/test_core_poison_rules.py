"""The rules behind poison-proof messaging, without I/O: which failures are permanent, how a message
is measured and cut, how repeated failures are logged, and which trace id a request's logs carry."""

from __future__ import annotations

import logging

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.exc import DBAPIError, OperationalError

from tessera.core.messaging.dead_letters import dead_letter_copy
from tessera.core.messaging.envelope import EnvelopeError
from tessera.core.messaging.failures import PermanentError, is_permanent
from tessera.core.messaging.limits import (
    ORIGINAL_SIZE,
    TRUNCATED,
    MessageTooLarge,
    check_fits,
    fit_body,
    wire_size,
)
from tessera.core.observability.http import TraceIdMiddleware
from tessera.core.observability.logs import TraceIdFilter, trace_id_from_headers
from tessera.core.observability.ratelimit import RateLimitedLog


class DriverError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"sqlstate {sqlstate}")
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("error", "permanent"),
    [
        (PermanentError("wrong type"), True),
        (EnvelopeError("body is not JSON"), True),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), True),
        (OverflowError("int too large"), True),
        (DBAPIError("INSERT", {}, DriverError("22003")), True),  # numeric value out of range
        (DBAPIError("INSERT", {}, DriverError("22001")), True),  # value too long for its column
        (OperationalError("SELECT", {}, DriverError("57P01")), False),  # the server shut down
        (DBAPIError("INSERT", {}, DriverError("40001")), False),  # a serialization failure: try again
        (RuntimeError("anything else"), False),
        (TimeoutError(), False),
        (ConnectionResetError(), False),
    ],
)
def test_only_the_message_s_own_faults_are_permanent(error: BaseException, permanent: bool) -> None:
    assert is_permanent(error) is permanent


def test_a_message_is_measured_with_its_headers_and_cut_to_fit() -> None:
    headers = {"ce-id": "abc", "Nats-Msg-Id": "abc"}
    # NATS/1.0\r\n + "ce-id: abc\r\n" + "Nats-Msg-Id: abc\r\n" + \r\n
    assert wire_size(headers, b"12345") == 10 + 12 + 18 + 2 + 5
    assert wire_size(None, b"12345") == 5
    check_fits("s", headers, b"12345", 47)
    with pytest.raises(MessageTooLarge, match="47 bytes with its headers, over the limit of 46 bytes"):
        check_fits("s", headers, b"12345", 46)

    assert fit_body(headers, b"small", 1000) == (headers, b"small")
    cut_headers, cut_body = fit_body(headers, b"x" * 5000, 1000)
    assert wire_size(cut_headers, cut_body) == 1000
    assert cut_headers[TRUNCATED] == "true" and cut_headers[ORIGINAL_SIZE] == "5000"


def test_a_dead_letter_copy_keeps_only_essential_headers_when_they_alone_are_too_large() -> None:
    headers = {"ce-id": "id-1", "ce-type": "t", "x-junk": "j" * 5000}
    copy, body = dead_letter_copy(
        headers=headers,
        body=b"b" * 10_000,
        subject="tessera.admission.cmd.submit_job",
        consumer="c",
        reason="because",
        deliveries=1,
        stream="TESSERA_ADMISSION",
        stream_sequence=42,
        limit=4096,
    )
    assert wire_size(copy, body) <= 4096 and "x-junk" not in copy
    assert copy["ce-id"] == "id-1" and copy["tessera-dlq-original-sequence"] == "42"
    assert copy["Nats-Msg-Id"] == "dlq-c-id-1"


def test_repeated_failures_are_logged_once_per_interval_with_a_count_of_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    limited = RateLimitedLog(logging.getLogger("test.ratelimit"), interval_s=10.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, "test.ratelimit")
    logged = [limited.warning("k", "failed") for _ in range(6)]
    assert logged == [True, False, False, False, False, False]
    assert limited.warning("other", "failed too") is True, "another key has its own allowance"
    now[0] = 10.5
    assert limited.warning("k", "failed") is True
    assert [getattr(r, "suppressed", None) for r in caplog.records] == [None, None, 5]
    with pytest.raises(ValueError, match="interval_s must be positive"):
        RateLimitedLog(logging.getLogger("x"), interval_s=0)


async def test_log_lines_inside_a_request_carry_its_trace_id(caplog: pytest.LogCaptureFixture) -> None:
    app = FastAPI()
    app.add_middleware(TraceIdMiddleware)
    log = logging.getLogger("test.request")

    @app.get("/work")
    async def work() -> dict[str, str]:
        log.info("working")
        return {}

    caplog.handler.addFilter(TraceIdFilter())
    caplog.set_level(logging.INFO, "test.request")
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        await client.get("/work", headers={"traceparent": traceparent})
        await client.get("/work")
        await client.get("/work")
    ids = [getattr(r, "trace_id", "") for r in caplog.records if r.getMessage() == "working"]
    assert ids[0] == "0af7651916cd43dd8448eb211c80319c"
    assert all(len(i) == 32 for i in ids[1:]) and ids[1] != ids[2], "a request without one gets its own"
    assert trace_id_from_headers({"traceparent": "00-" + "0" * 32 + "-b7ad6b7169203331-01"}) == ""
    assert trace_id_from_headers({"traceparent": "garbage"}) == ""
