"""Telemetry's routine polls are DEBUG lines, not INFO; a failure that repeats every round is logged
once per interval with the count of the lines left out."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest

from tessera.telemetry.entrypoints.logs import DemoteToDebug, failure_log, quiet_http_polls


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept() -> Iterator[Kept]:
    handler = Kept()
    root = logging.getLogger()
    level = root.level
    # httpx's logger as a fresh process has it: a service started earlier in this process may have
    # quieted it already (quiet_http_polls is once per process) or changed its level.
    httpx_logger = logging.getLogger("httpx")
    saved = (list(httpx_logger.filters), httpx_logger.level, httpx_logger.disabled, httpx_logger.propagate)
    httpx_logger.filters[:] = [f for f in httpx_logger.filters if not isinstance(f, DemoteToDebug)]
    httpx_logger.setLevel(logging.NOTSET)
    httpx_logger.disabled, httpx_logger.propagate = False, True
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        httpx_logger.filters[:] = saved[0]
        httpx_logger.setLevel(saved[1])
        httpx_logger.disabled, httpx_logger.propagate = saved[2], saved[3]


def poll(status: int) -> int:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, json={"nodes": []}))
    with httpx.Client(transport=transport) as client:
        return client.get("http://devcluster.test/nvml").status_code


def http_lines(kept: Kept) -> list[logging.LogRecord]:
    return [r for r in kept.records if r.name == "httpx" and "HTTP Request" in r.getMessage()]


def test_httpx_writes_an_info_line_per_poll_until_telemetry_quiets_it(kept: Kept) -> None:
    assert poll(200) == 200
    assert [r.levelno for r in http_lines(kept)] == [logging.INFO]  # httpx's own behaviour

    quiet_http_polls()
    quiet_http_polls()  # once per process, however often the service starts
    assert sum(isinstance(f, DemoteToDebug) for f in logging.getLogger("httpx").filters) == 1
    kept.records.clear()
    assert (poll(200), poll(503)) == (200, 503)
    assert http_lines(kept) == []


def test_with_debug_enabled_the_polls_are_logged_as_debug(kept: Kept) -> None:
    quiet_http_polls()
    logging.getLogger("httpx").setLevel(logging.DEBUG)
    poll(200)
    lines = http_lines(kept)
    assert lines and {(r.levelno, r.levelname) for r in lines} == {(logging.DEBUG, "DEBUG")}


def test_other_levels_pass_unchanged(kept: Kept) -> None:
    quiet_http_polls()
    logging.getLogger("httpx").warning("the pool is full")
    assert [(r.levelno, r.getMessage()) for r in kept.records] == [(logging.WARNING, "the pool is full")]


def test_a_failure_every_round_is_logged_once_per_interval_with_the_count(kept: Kept) -> None:
    now = [0.0]
    failures = failure_log(logging.getLogger("tessera.telemetry.test"), interval_s=30.0)
    failures.clock = lambda: now[0]
    for second in range(0, 65, 5):  # a source away for a minute, read every 5 s
        now[0] = float(second)
        failures.warning("read", "the GPUs cannot be read", extra={"reason": "refused"})
    logged = [r for r in kept.records if r.name == "tessera.telemetry.test"]
    assert [r.levelno for r in logged] == [logging.WARNING] * 3  # at 0, 30 and 60 s
    assert [getattr(r, "suppressed", 0) for r in logged] == [0, 5, 5]
