"""Through the handlers: the scheduler's outcomes in the order a consumer of two streams may see them."""

from __future__ import annotations

from typing import Any

from tessera.admission.domain.model import JobState
from tessera.admission.service_layer.cycle import run_cycle
from tessera.admission.service_layer.handlers import (
    handle_outcome_command,
    handle_scheduler_event,
    report_outcome,
    submit_job,
)
from tessera.contracts.base import Message
from tessera.contracts.events import (
    GangFinished,
    GangPlaced,
    GpuAssignment,
    JobFinished,
    PodPlacement,
    ReportJobOutcome,
)
from tessera.testing.builders import a_job, an_envelope


async def deliver(handler: Any, message: Message, uow: Any) -> None:
    async with uow:
        await handler(an_envelope(message), uow)
        await uow.commit()


async def admitted(uow: Any, job_id: str) -> None:
    async with uow:
        await submit_job(a_job(job_id).as_dict(), uow, job_id)
        await uow.commit()
    async with uow:
        assert job_id in (await run_cycle(uow)).admitted


def placed(job_id: str) -> GangPlaced:
    pods = [
        PodPlacement(
            pod=f"{job_id}-{i}",
            group="w",
            node="gpu-1",
            gpus=[GpuAssignment(index=i, uuid=f"G{i}", milli=1000)],
        )
        for i in range(2)
    ]
    return GangPlaced(job_id=job_id, placements=pods)


async def test_running_before_gang_placed_runs_and_the_late_placement_records_the_gpus(uow: Any) -> None:
    await admitted(uow, "j1")
    await deliver(handle_outcome_command, ReportJobOutcome(job_id="j1", state="running"), uow)
    assert uow.job("j1").state is JobState.RUNNING
    assert "j1" not in uow.fake_inventory.placements, "no placement is known yet"
    saves = uow.fake_jobs.saves
    await deliver(handle_scheduler_event, placed("j1"), uow)
    assert uow.job("j1").state is JobState.RUNNING and uow.fake_jobs.saves == saves, "state untouched"
    assert [p["pod"] for p in uow.fake_inventory.placements["j1"]] == ["j1-0", "j1-1"]


async def test_a_placement_after_the_job_ended_records_nothing(uow: Any) -> None:
    await admitted(uow, "j1")
    await deliver(handle_outcome_command, ReportJobOutcome(job_id="j1", state="succeeded"), uow)
    await deliver(handle_scheduler_event, placed("j1"), uow)
    assert uow.job("j1").state is JobState.SUCCEEDED
    assert "j1" not in uow.fake_inventory.placements, "an ended job holds no GPUs"


async def test_a_repeated_running_report_returns_the_job_unchanged(uow: Any) -> None:
    await admitted(uow, "j1")
    await deliver(handle_scheduler_event, placed("j1"), uow)
    await deliver(handle_outcome_command, ReportJobOutcome(job_id="j1", state="running"), uow)
    outbox = len(uow.outbox)
    async with uow:
        job = await report_outcome("j1", "running", "again", uow)
        await uow.commit()
    assert job is not None and job.state is JobState.RUNNING
    assert len(uow.outbox) == outbox


async def test_gang_finished_before_running_ends_the_job_once(uow: Any) -> None:
    await admitted(uow, "j1")
    await deliver(handle_scheduler_event, placed("j1"), uow)
    await deliver(
        handle_scheduler_event, GangFinished(job_id="j1", succeeded=True, pods={"j1-0": "Succeeded"}), uow
    )
    await deliver(handle_outcome_command, ReportJobOutcome(job_id="j1", state="running"), uow)
    assert uow.job("j1").state is JobState.SUCCEEDED
    assert [e.state for e in uow.events_of(JobFinished)] == ["succeeded"]
