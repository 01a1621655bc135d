"""A scheduling cycle that fails every round (the database away) is logged once per interval, with
its traceback the first time, not once per round."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tessera.core.observability.ratelimit import RateLimitedLog
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.service_layer import engine as engine_module
from tessera.scheduler.service_layer.engine import SchedulingEngine


@contextlib.asynccontextmanager
async def unreachable() -> AsyncIterator[Any]:
    raise ConnectionRefusedError("the database is away")
    yield  # pragma: no cover


async def test_a_failing_cycle_is_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    settings = SchedulerSettings.model_construct(poll_s=0.001)
    engine = SchedulingEngine(unreachable, settings)
    rounds = 0
    enough = asyncio.Event()

    def clock() -> float:  # read once per failed round; the time stands still
        nonlocal rounds
        rounds += 1
        if rounds >= 20:
            enough.set()
        return 0.0

    engine.failures = RateLimitedLog(engine_module.log, interval_s=30.0, clock=clock)
    stop = asyncio.Event()
    with caplog.at_level(logging.ERROR, logger=engine_module.log.name):
        task = asyncio.create_task(engine.run(stop))
        await asyncio.wait_for(enough.wait(), timeout=60)
        stop.set()
        await asyncio.wait_for(task, timeout=10)
    engine.close()
    failed = [r for r in caplog.records if r.getMessage().startswith("scheduling cycle failed")]
    assert rounds >= 20 and len(failed) == 1
    assert failed[0].exc_info is not None  # the first one with its traceback
