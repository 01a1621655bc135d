"""What the scheduler logs of its decisions: each decision is in its span and its event, so the log
says only what an operator would not want to miss: a gang's first reason for not fitting and each
new one, and failures; a placement and a repeated reason go at DEBUG."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest

from tessera.scheduler.domain.gang.queue import GangQueue
from tessera.scheduler.domain.gang.scheduler import GangOutcome, OutcomeKind
from tessera.scheduler.domain.snapshot import Allocation
from tessera.scheduler.service_layer import outcomes
from tessera.scheduler.service_layer.outcomes import GangInfo, record_outcome

FakeUnit = Any  # conftest's FakeSchedulerUnitOfWork


async def test_a_reason_is_logged_once_until_it_changes_and_a_placement_only_at_debug(
    uow: FakeUnit, caplog: pytest.LogCaptureFixture
) -> None:
    info = GangInfo("job-1", "job")
    waiting = GangOutcome("job-1", OutcomeKind.UNSCHEDULABLE, message="gang needs 16 GPUs, 8 free")
    placed = GangOutcome(
        "job-1", OutcomeKind.PLACED, bound=(Allocation("ns/p-0", "job-1", "n0", ((0, 1000),)),)
    )
    failed = GangOutcome("job-1", OutcomeKind.BIND_FAILED, message="bind of ns/p-0 refused")

    with caplog.at_level(logging.DEBUG, logger=outcomes.log.name):
        async with uow:
            for outcome in (
                waiting,
                waiting,
                waiting,
                replace(waiting, message="gang needs 16 GPUs, 0 free"),
            ):
                await record_outcome(outcome, info, GangQueue(), uow.repo, uow, {})
            await record_outcome(failed, info, GangQueue(), uow.repo, uow, {})
            await record_outcome(failed, info, GangQueue(), uow.repo, uow, {})
            await record_outcome(placed, info, GangQueue(), uow.repo, uow, {})

    lines = [
        (r.levelname, r.getMessage(), getattr(r, "reasons", ""))
        for r in caplog.records
        if r.name == outcomes.log.name  # not what other libraries log meanwhile
    ]
    assert lines == [
        ("INFO", "gang not placed", "gang needs 16 GPUs, 8 free"),
        ("DEBUG", "gang not placed", "gang needs 16 GPUs, 8 free"),
        ("DEBUG", "gang not placed", "gang needs 16 GPUs, 8 free"),
        ("INFO", "gang not placed", "gang needs 16 GPUs, 0 free"),
        ("INFO", "gang not placed", "bind of ns/p-0 refused"),
        ("INFO", "gang not placed", "bind of ns/p-0 refused"),
        ("DEBUG", "gang placed", ""),
    ]
