"""A cycle that fails every round (the database away) is logged once per interval, not per round."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from tessera.admission.entrypoints import cycle
from tessera.core.observability.metrics import Metrics
from tessera.core.observability.ratelimit import RateLimitedLog


@contextlib.asynccontextmanager
async def unreachable() -> AsyncIterator[Any]:
    raise ConnectionRefusedError("the database is away")
    yield  # pragma: no cover


async def test_a_failing_cycle_is_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cycle, "failures", RateLimitedLog(cycle.log, interval_s=30.0))
    stop = asyncio.Event()
    deps: Any = SimpleNamespace(
        ctx=SimpleNamespace(stop=stop, metrics=Metrics()),
        cycle_interval_s=0.005,
        full_cycle_interval_s=0.005,
        cycle_wake=asyncio.Event(),
        uow=unreachable,
    )
    rounds = 0
    enough = asyncio.Event()

    def clock() -> float:  # read once per failed round; the time stands still
        nonlocal rounds
        rounds += 1
        if rounds >= 20:
            enough.set()
        return 0.0

    monkeypatch.setattr(cycle.failures, "clock", clock)
    with caplog.at_level(logging.ERROR, logger=cycle.log.name):
        task = asyncio.create_task(cycle.admission_cycle(deps))
        await asyncio.wait_for(enough.wait(), timeout=30)
        stop.set()
        await asyncio.wait_for(task, timeout=5)
    failed = [r for r in caplog.records if r.getMessage() == "admission cycle failed"]
    assert rounds >= 20 and len(failed) == 1
    assert failed[0].exc_info is not None  # the first one with its traceback
