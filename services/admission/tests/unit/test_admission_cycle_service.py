"""The admission cycle through the service layer, on in-memory repositories: the engine's decisions
become `Job` transitions (admit, request or force a preemption, wait), the jobs are saved, and their
events reach the outbox when the cycle commits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tessera.admission.domain.model import JobState
from tessera.admission.domain.queueing import Admit, CycleResult, Wait, WaitReason
from tessera.admission.service_layer.cycle import INADMISSIBLE, apply_decisions, run_cycle
from tessera.admission.service_layer.cycle_state import load_cycle_state
from tessera.admission.service_layer.handlers import (
    cancel_job,
    handle_checkpoint_saved,
    handle_inventory,
    report_outcome,
    submit_job,
)
from tessera.contracts.events import (
    CheckpointSaved,
    GpuInventory,
    InventoryChanged,
    JobAdmitted,
    JobFinished,
    JobStateChanged,
    NodeInventory,
    PreemptionRequested,
)
from tessera.testing.builders import a_job, an_envelope

FOUR_GPUS = {
    "flavors": [{"name": "a100"}],
    "queues": [{"name": "team-q", "quotas": [{"flavor": "a100", "resources": {"gpu": 4}}]}],
    "tenant_queues": [{"tenant": "team", "queue": "team-q"}],
}


async def submit(uow: Any, job_id: str, gpus: int = 2, priority: int = 0, **fields: Any) -> None:
    spec = a_job(job_id).tenant("team").priority(priority).group(gpus=gpus).with_(**fields).as_dict()
    async with uow:
        result = await submit_job(spec, uow, job_id)
        await uow.commit()
    assert result.state is JobState.QUEUED, result.errors


async def cycle(uow: Any, now: datetime | None = None) -> Any:
    async with uow:
        return await run_cycle(uow, now=now)


def waits(uow: Any, job_id: str) -> list[str]:
    return [
        e.reason for e in uow.events_of(JobStateChanged) if e.job_id == job_id and e.state == e.previous_state
    ]


async def test_what_fits_is_admitted_and_announced_with_its_spec_and_the_rest_waits(uow: Any) -> None:
    uow.configure(FOUR_GPUS)
    for job_id in ("first", "second", "third"):
        await submit(uow, job_id)
    report = await cycle(uow)
    assert report.admitted == ["first", "second"] and report.waiting == 1
    for job_id in ("first", "second"):
        job = uow.job(job_id)
        assert (job.state, job.flavors, job.waiting) == (JobState.ADMITTED, ("a100",), None)
        assert job.history[-1].reason == "admitted to queue team-q in flavor a100"
    assert [(e.job_id, e.spec) for e in uow.events_of(JobAdmitted)] == [
        ("first", uow.job("first").spec),
        ("second", uow.job("second").spec),
    ]
    third = uow.job("third")
    assert third.state is JobState.QUEUED
    assert third.waiting is not None and third.waiting[0] == WaitReason.QUOTA_EXHAUSTED.value
    assert waits(uow, "third") == [f"waiting: QuotaExhausted: {third.waiting[1]}"]
    assert uow.fake_gate.locks == 1


async def test_a_cycle_that_changes_nothing_announces_nothing_and_loads_no_job(uow: Any) -> None:
    uow.configure(FOUR_GPUS)
    for job_id in ("first", "second", "third"):
        await submit(uow, job_id)
    await cycle(uow)
    announced, saves = len(uow.outbox), uow.fake_jobs.saves
    report = await cycle(uow)
    assert report.admitted == [] and report.waiting == 1
    assert len(uow.outbox) == announced and uow.fake_jobs.saves == saves
    assert uow.fake_jobs.loaded_in_bulk[-1] == set(), "the same wait again is no news"
    assert len(uow.job("third").history) == 3, "submitted, queued, one wait"


async def test_a_higher_priority_job_asks_the_lower_one_to_leave_and_takes_its_quota_at_the_deadline(
    uow: Any,
) -> None:
    uow.configure(FOUR_GPUS)
    await submit(uow, "low", gpus=4)
    await cycle(uow)
    await submit(uow, "urgent", gpus=4, priority=100)
    report = await cycle(uow)
    assert report.preemptions == ["low"] and report.admitted == []
    (asked,) = uow.events_of(PreemptionRequested)
    assert (asked.victim_job_id, asked.preemptor_job_id, asked.forced) == ("low", "urgent", False)
    low = uow.job("low")
    assert (low.state, low.preempted_by, low.preemption_deadline) == (
        JobState.ADMITTED,
        "urgent",
        asked.deadline,
    )
    assert low.history[-1].reason.startswith("preemption requested by urgent (InQueuePriority); grace 30s")
    assert [r.preemptor for r in uow.fake_cycle_records.inflight] == ["urgent"]
    assert [d.victim for d in uow.fake_cycle_records.draining] == ["low"]
    assert uow.job("urgent").waiting == ("WaitingForVictims", "preempting low")
    assert report.next_deadline == asked.deadline

    report = await cycle(uow, now=asked.deadline + timedelta(seconds=1))
    assert report.released == ["low"] and report.admitted == ["urgent"]
    forced = uow.events_of(PreemptionRequested)[-1]
    assert (forced.victim_job_id, forced.forced) == ("low", True)
    low = uow.job("low")
    assert [(t.state, t.reason) for t in low.history[-2:]] == [
        (JobState.PREEMPTED, "preempted by urgent (InQueuePriority): release deadline passed"),
        (JobState.QUEUED, "requeued after preemption"),
    ]
    assert (low.preempted_by, low.flavors, low.admitted_at) == (None, (), None)
    assert [(e.job_id, e.state) for e in uow.events_of(JobFinished)] == [("low", "preempted")]
    assert uow.job("urgent").state is JobState.ADMITTED
    assert uow.fake_cycle_records.inflight == [] and uow.fake_cycle_records.draining == []


async def test_quota_without_room_on_the_gpus_waits_for_a_feasible_placement(uow: Any) -> None:
    uow.configure(FOUR_GPUS)
    one_gpu = [GpuInventory(index=0, uuid="GPU-0", model="A100", memory_mib=81920)]
    node = NodeInventory(name="gpu-1", cpu_milli=64000, memory_mib=512000, gpus=one_gpu)
    async with uow:
        await handle_inventory(an_envelope(InventoryChanged(source="cluster", nodes=[node])), uow)
        await uow.commit()
    await submit(uow, "big", gpus=2)
    await submit(uow, "small", gpus=1)
    report = await cycle(uow)
    assert report.admitted == ["small"]
    big = uow.job("big")
    assert big.state is JobState.QUEUED and big.waiting is not None
    assert big.waiting[0] == WaitReason.NO_FEASIBLE_PLACEMENT.value
    assert waits(uow, "big") == [f"waiting: NoFeasiblePlacement: {big.waiting[1]}"]


async def test_a_queued_job_the_configuration_no_longer_takes_waits_as_inadmissible(uow: Any) -> None:
    uow.configure(FOUR_GPUS)
    await submit(uow, "orphan", gpus=2)
    uow.configure({"queues": [{"name": "team-q", "quotas": [{"flavor": "a100", "resources": {"gpu": 1}}]}]})
    report = await cycle(uow)
    orphan = uow.job("orphan")
    assert report.admitted == [] and orphan.state is JobState.QUEUED
    assert orphan.waiting == (
        INADMISSIBLE,
        "pod_groups[0].requests.gpu: exceeds queue capacity: asks 2, "
        "queue 'team-q' can reach at most 1 in flavor a100",
    )
    assert waits(uow, "orphan") == [f"waiting: {INADMISSIBLE}: {orphan.waiting[1]}"]


async def test_apply_turns_each_decision_into_its_jobs_transition_and_saves_them_together(uow: Any) -> None:
    uow.configure(FOUR_GPUS)
    for job_id in ("a", "b", "c"):
        await submit(uow, job_id)
    uow.job("c").waiting = ("QuotaExhausted", "full")  # the last cycle already said so
    now = datetime.now(UTC)
    async with uow:
        state = await load_cycle_state(uow, now)
        result = CycleResult(
            [
                Admit("a", "team-q", ("a100",), {("a100", "gpu"): 2}, borrows=True),
                Wait("b", "team-q", WaitReason.BLOCKED_BY_HEAD, "behind a"),
                Wait("c", "team-q", WaitReason.QUOTA_EXHAUSTED, "full"),
            ],
            admitted=1,
            examined=3,
        )
        report = await apply_decisions(uow, state, result, now)
        await uow.commit()
    assert report.admitted == ["a"] and report.examined == 3
    assert uow.fake_jobs.loaded_in_bulk == [{"a", "b"}], "c's wait is no news: c is not even loaded"
    assert uow.job("a").state is JobState.ADMITTED
    assert uow.job("a").history[-1].reason == "admitted to queue team-q in flavor a100 (borrowing)"
    assert uow.job("b").waiting == ("BlockedByHead", "behind a")
    assert [e.job_id for e in uow.events_of(JobAdmitted)] == ["a"]
    assert waits(uow, "b") == ["waiting: BlockedByHead: behind a"] and waits(uow, "c") == []
    assert uow.commits == 4, "three submissions, then one for every decision applied"


async def checkpoint(uow: Any, job_id: str, step: int, at: datetime) -> str:
    uri = f"file:///ckpt/{job_id}/step-{step}"
    saved = CheckpointSaved(job_id=job_id, step=step, uri=uri, size_bytes=2**20, at=at)
    async with uow:
        await handle_checkpoint_saved(an_envelope(saved), uow)
        await uow.commit()
    return uri


async def test_a_preempted_job_queues_again_and_is_admitted_resuming_from_its_newest_checkpoint(
    uow: Any,
) -> None:
    uow.configure(FOUR_GPUS)
    t0 = datetime.now(UTC)
    await submit(uow, "low", gpus=4, checkpointable=True)
    await cycle(uow, now=t0)
    await checkpoint(uow, "low", 40, t0 + timedelta(seconds=30))
    newest = await checkpoint(uow, "low", 70, t0 + timedelta(seconds=60))
    await submit(uow, "urgent", gpus=4, priority=100)
    assert (await cycle(uow, now=t0 + timedelta(seconds=61))).preemptions == ["low"]
    async with uow:  # the scheduler evicted it once its checkpoint was saved
        await report_outcome("low", "preempted", "1 pods evicted for urgent after checkpoint_saved", uow)
        await uow.commit()
    assert uow.job("low").state is JobState.QUEUED

    report = await cycle(uow, now=t0 + timedelta(seconds=62))
    assert report.admitted == ["urgent"] and uow.job("low").waiting is not None, "low waits for quota"
    async with uow:
        await cancel_job("urgent", uow)
        await uow.commit()
    assert (await cycle(uow, now=t0 + timedelta(seconds=90))).admitted == ["low"]

    admitted = [e for e in uow.events_of(JobAdmitted) if e.job_id == "low"]
    assert [e.resume_from for e in admitted] == [None, newest]
    assert uow.job("low").history[-1].reason.endswith(f"resumes from the checkpoint at step 70 ({newest})")


async def test_the_cycle_reads_checkpoint_times_in_bulk_and_preempts_the_job_that_loses_least(
    uow: Any,
) -> None:
    """Equal priority, admitted in the same cycle: `older` would go first by Kueue's order (`newer`
    was created later), but `older` checkpointed more recently, so evicting it loses less."""
    uow.configure(FOUR_GPUS)
    t0 = datetime.now(UTC)
    await submit(uow, "older", gpus=2, checkpointable=True)
    await submit(uow, "newer", gpus=2, checkpointable=True)
    await cycle(uow, now=t0)
    await checkpoint(uow, "newer", 10, t0 + timedelta(seconds=10))
    await checkpoint(uow, "older", 20, t0 + timedelta(seconds=50))
    await submit(uow, "urgent", gpus=2, priority=100)

    report = await cycle(uow, now=t0 + timedelta(seconds=60))

    assert report.preemptions == ["older"]
    assert uow.fake_checkpoints.bulk_reads[-1] == {"older", "newer"}, "one read for the jobs holding quota"
