"""Every handler of the checkpoint service through its unit of work, on in-memory repositories: what
each message stores and announces, and that repeats and late news announce nothing twice."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from tessera.checkpoint.domain.model import CheckpointRequest, RequestState
from tessera.checkpoint.service_layer import handlers as on
from tessera.checkpoint.service_layer.deadlines import expire_overdue
from tessera.checkpoint.service_layer.dependencies import CheckpointDeps
from tessera.contracts import subjects
from tessera.contracts.base import Message
from tessera.contracts.events import (
    CheckpointFailed,
    CheckpointSaved,
    GangFinished,
    GangPlaced,
    JobAdmitted,
    JobFinished,
    PodPlacement,
    PreemptionRequested,
    ReadyForEviction,
    ReportCheckpoint,
    SaveCheckpoint,
)
from tessera.core.messaging.consumer import Handler, PermanentError
from tessera.testing.builders import a_job, an_envelope
from tessera.testing.fakes import FakeUnitOfWork

JOB = "job-1"
URI = "file:///ckpt/job-1/step-10"


async def handle(handler: Handler[Any], message: Message, uow: Any, *, at: datetime | None = None) -> None:
    async with uow:
        envelope = an_envelope(message)
        await handler(replace(envelope, time=at) if at is not None else envelope, uow)
        await uow.commit()


def preemption(deps: CheckpointDeps, *, grace_s: float = 30, **fields: Any) -> PreemptionRequested:
    values: dict[str, Any] = {
        "victim_job_id": JOB,
        "preemptor_job_id": "urgent",
        "reason": "InCohortReclamation",
        "deadline": deps.clock() + timedelta(seconds=grace_s),
        "grace_period_s": grace_s,
        "checkpointable": True,
        **fields,
    }
    return PreemptionRequested.model_validate(values)


def report(
    outcome: str = "saved", request_id: str | None = None, uri: str = URI, step: int = 10
) -> ReportCheckpoint:
    return ReportCheckpoint.model_validate(
        {
            "job_id": JOB,
            "request_id": request_id,
            "outcome": outcome,
            "step": step,
            "size_bytes": 1024,
            "uri": uri if outcome == "saved" else "",
            "reason": "requested" if outcome == "saved" else "OSError: disk full",
            "at": "2026-11-24T09:00:05+00:00",
        }
    )


async def ask(deps: CheckpointDeps, uow: FakeUnitOfWork) -> SaveCheckpoint:
    """A checkpointable victim's preemption; the save command it caused."""
    await handle(on.on_preemption_requested(deps), preemption(deps), uow)
    [command] = uow.events_of(SaveCheckpoint)
    uow.outbox.clear()
    return command


def eviction(uow: FakeUnitOfWork) -> list[tuple[str, str | None, str | None]]:
    ready = uow.events_of(ReadyForEviction)
    assert all(e.preemptor_job_id == "urgent" for e in ready), "the scheduler matches it to its preemption"
    return [(e.reason, e.checkpoint_uri, e.cause) for e in ready]


# -- preemption_requested ------------------------------------------------------------------------------
async def test_a_checkpointable_victim_is_asked_to_save_on_its_own_subject(
    deps: CheckpointDeps, uow: Any
) -> None:
    event = preemption(deps)
    await handle(on.on_preemption_requested(deps), event, uow)
    [command] = uow.outbox
    assert isinstance(command, SaveCheckpoint)
    assert (command.job_id, command.reason, command.deadline) == (JOB, "preemption", event.deadline)
    assert command.subject() == subjects.save_checkpoint(JOB) == "tessera.checkpoint.cmd.save.job-1"
    request = uow.stored.requests[command.request_id]
    assert (request.state, request.deadline) == (RequestState.SAVING, event.deadline)
    assert uow.stored.jobs[JOB].checkpointable is True
    assert deps.deadline_wake.is_set(), "the deadline loop learns of the new deadline after commit"


async def test_a_second_preemption_of_the_same_victim_sends_nothing_but_may_hasten_it(
    deps: CheckpointDeps, uow: Any
) -> None:
    command = await ask(deps, uow)
    await handle(on.on_preemption_requested(deps), preemption(deps, grace_s=60), uow)
    await handle(on.on_preemption_requested(deps), preemption(deps, grace_s=10), uow)
    assert uow.outbox == []
    assert [r.deadline for r in uow.stored.requests.values()] == [deps.clock() + timedelta(seconds=10)]
    assert list(uow.stored.requests) == [command.request_id]


async def test_a_victim_that_cannot_checkpoint_is_ready_at_once_with_its_last_checkpoint(
    deps: CheckpointDeps, uow: Any
) -> None:
    await handle(on.on_report_checkpoint(deps), report(), uow)  # a periodic checkpoint from before
    uow.outbox.clear()
    await handle(on.on_preemption_requested(deps), preemption(deps, checkpointable=False), uow)
    assert eviction(uow) == [("not_checkpointable", URI, "preemption")]
    assert uow.stored.requests == {} and uow.stored.jobs[JOB].checkpointable is False


async def test_a_forced_victim_is_ready_at_once_and_its_open_request_ends(
    deps: CheckpointDeps, uow: Any
) -> None:
    await handle(on.on_preemption_requested(deps), preemption(deps, forced=True), uow)
    assert eviction(uow) == [("deadline_passed", None, "preemption")]
    uow.outbox.clear()

    command = await ask(deps, uow)
    await handle(on.on_preemption_requested(deps), preemption(deps, forced=True), uow)
    assert [e.reason for e in uow.events_of(CheckpointFailed)] == ["deadline_passed"]
    assert eviction(uow) == [("deadline_passed", None, "preemption")]
    assert uow.stored.requests[command.request_id].state is RequestState.TIMED_OUT


async def test_a_preemption_whose_deadline_already_passed_waits_for_nothing(
    deps: CheckpointDeps, uow: Any
) -> None:
    await handle(on.on_preemption_requested(deps), preemption(deps, grace_s=0), uow)
    assert eviction(uow) == [("deadline_passed", None, "preemption")] and uow.stored.requests == {}


async def test_a_job_already_asked_for_its_node_answers_the_preemption_with_the_same_checkpoint(
    deps: CheckpointDeps, uow: Any, clock: Any
) -> None:
    async with uow:
        request = CheckpointRequest.ask(
            "spot-1", JOB, "spot_interruption", clock() + timedelta(seconds=30), clock()
        )
        await uow.requests.add(request)
        await uow.commit()
    uow.outbox.clear()
    await handle(on.on_preemption_requested(deps), preemption(deps, grace_s=20), uow)
    assert uow.outbox == [], "no second save command"
    stored = uow.stored.requests["spot-1"]
    assert (stored.preemptor_job_id, stored.deadline) == ("urgent", clock() + timedelta(seconds=20))
    await handle(on.on_report_checkpoint(deps), report(request_id="spot-1"), uow)
    assert [(e.reason, e.preemptor_job_id, e.cause) for e in uow.events_of(ReadyForEviction)] == [
        ("checkpoint_saved", "urgent", "spot_interruption")
    ]


async def test_a_preemption_decided_before_the_job_ended_asks_nothing(
    deps: CheckpointDeps, uow: Any, clock: Any
) -> None:
    decided_at = clock()
    finished = JobFinished(job_id=JOB, state="cancelled", reason="by request", at=clock.advance(1))
    await handle(on.on_job_finished(deps), finished, uow)
    await handle(on.on_preemption_requested(deps), preemption(deps), uow, at=decided_at)
    assert uow.outbox == [] and uow.stored.requests == {}


# -- report_checkpoint ---------------------------------------------------------------------------------
async def test_a_saved_report_records_the_checkpoint_and_lets_the_eviction_go(
    deps: CheckpointDeps, uow: Any
) -> None:
    command = await ask(deps, uow)
    await handle(on.on_report_checkpoint(deps), report(request_id=command.request_id), uow)
    [saved] = uow.events_of(CheckpointSaved)
    assert (saved.job_id, saved.request_id, saved.step, saved.uri, saved.size_bytes) == (
        JOB,
        command.request_id,
        10,
        URI,
        1024,
    )
    assert eviction(uow) == [("checkpoint_saved", URI, "preemption")]
    assert uow.events_of(ReadyForEviction)[0].step == 10
    request = uow.stored.requests[command.request_id]
    assert (request.state, request.checkpoint_uri) == (RequestState.SAVED, URI)
    assert [c.uri for c in uow.stored.checkpoints.values()] == [URI]


async def test_the_same_report_again_announces_nothing(deps: CheckpointDeps, uow: Any) -> None:
    command = await ask(deps, uow)
    for _ in range(2):  # two deliveries with different message ids: the inbox cannot tell them apart
        await handle(on.on_report_checkpoint(deps), report(request_id=command.request_id), uow)
    assert len(uow.events_of(CheckpointSaved)) == 1 and len(uow.events_of(ReadyForEviction)) == 1
    assert len(uow.stored.checkpoints) == 1


async def test_a_failed_report_lets_the_eviction_go_with_the_checkpoint_before(
    deps: CheckpointDeps, uow: Any
) -> None:
    await handle(on.on_report_checkpoint(deps), report(uri="file:///ckpt/job-1/step-5", step=5), uow)
    command = await ask(deps, uow)
    await handle(on.on_report_checkpoint(deps), report("failed", command.request_id), uow)
    assert [e.reason for e in uow.events_of(CheckpointFailed)] == ["OSError: disk full"]
    assert eviction(uow) == [("checkpoint_failed", "file:///ckpt/job-1/step-5", "preemption")]
    assert uow.stored.requests[command.request_id].state is RequestState.FAILED


async def test_a_periodic_report_is_recorded_and_announced_and_a_periodic_failure_is_not(
    deps: CheckpointDeps, uow: Any
) -> None:
    await handle(on.on_report_checkpoint(deps), report(), uow)
    await handle(on.on_report_checkpoint(deps), report("failed"), uow)
    assert [(type(e), e.request_id) for e in uow.outbox] == [(CheckpointSaved, None)]
    assert len(uow.stored.checkpoints) == 1


async def test_a_late_saved_report_is_recorded_but_evicts_nothing_twice(
    deps: CheckpointDeps, uow: Any, clock: Any
) -> None:
    command = await ask(deps, uow)
    async with uow:
        await expire_overdue(uow, clock.advance(30))
        await uow.commit()
    assert eviction(uow) == [("checkpoint_timeout", None, "preemption")]
    uow.outbox.clear()
    await handle(on.on_report_checkpoint(deps), report(request_id=command.request_id), uow)
    assert [type(e) for e in uow.outbox] == [CheckpointSaved], "durable, so announced; but no second eviction"
    assert uow.stored.requests[command.request_id].state is RequestState.TIMED_OUT
    assert len(uow.stored.checkpoints) == 1


async def test_a_report_for_a_request_it_does_not_know_only_records_the_checkpoint(
    deps: CheckpointDeps, uow: Any
) -> None:
    await handle(on.on_report_checkpoint(deps), report(request_id="from-another-life"), uow)
    assert [type(e) for e in uow.outbox] == [CheckpointSaved]


@pytest.mark.parametrize(
    ("message", "why"),
    [
        (report().model_copy(update={"uri": ""}), "names no checkpoint"),
        (GangFinished(job_id=JOB, succeeded=True), "expected io.tessera.checkpoint.report_checkpoint"),
    ],
)
async def test_a_report_that_can_never_be_handled_is_dead_lettered(
    deps: CheckpointDeps, uow: Any, message: Message, why: str
) -> None:
    with pytest.raises(PermanentError, match=why):
        await handle(on.on_report_checkpoint(deps), message, uow)
    assert uow.outbox == [] and uow.stored.checkpoints == {}


async def test_a_report_naming_another_jobs_request_is_dead_lettered(deps: CheckpointDeps, uow: Any) -> None:
    command = await ask(deps, uow)
    other = report(request_id=command.request_id).model_copy(update={"job_id": "job-2"})
    with pytest.raises(PermanentError, match="is not for"):
        await handle(on.on_report_checkpoint(deps), other, uow)


# -- where jobs run, and when they end -----------------------------------------------------------------
def placed(*nodes: str) -> GangPlaced:
    return GangPlaced(
        job_id=JOB,
        placements=[PodPlacement(pod=f"{JOB}-{i}", group="w", node=n) for i, n in enumerate(nodes)],
    )


async def test_admission_and_placement_say_whether_and_where_a_job_runs(
    deps: CheckpointDeps, uow: Any, clock: Any
) -> None:
    spec = a_job("train").with_(checkpointable=True).build()
    await handle(on.on_job_admitted(deps), JobAdmitted(job_id=JOB, spec=spec, submitted_at=clock()), uow)
    await handle(on.on_gang_placed(deps), placed("n0", "n1"), uow, at=clock.advance(1))
    job = uow.stored.jobs[JOB]
    assert job.checkpointable is True and job.pods == {f"{JOB}-0": "n0", f"{JOB}-1": "n1"}
    await handle(
        on.on_gang_finished(deps), GangFinished(job_id=JOB, succeeded=True), uow, at=clock.advance(1)
    )
    assert uow.stored.jobs[JOB].pods == {}
    assert uow.outbox == []


async def test_a_finished_job_is_forgotten_and_its_open_request_cancelled_silently(
    deps: CheckpointDeps, uow: Any, clock: Any
) -> None:
    await handle(on.on_gang_placed(deps), placed("n0"), uow, at=clock())
    command = await ask(deps, uow)
    finished = JobFinished(job_id=JOB, state="succeeded", reason="all pods succeeded", at=clock.advance(5))
    await handle(on.on_job_finished(deps), finished, uow)
    assert uow.stored.jobs[JOB].pods == {} and uow.stored.jobs[JOB].finished
    request = uow.stored.requests[command.request_id]
    assert (request.state, request.outcome) == (RequestState.CANCELLED, "job succeeded: all pods succeeded")
    assert uow.outbox == []
    await handle(on.on_gang_placed(deps), placed("n3"), uow, at=clock() - timedelta(seconds=1))
    assert uow.stored.jobs[JOB].pods == {}, "a placement delivered after the job's end is stale"


async def test_an_earlier_runs_end_delivered_late_leaves_the_run_now_and_its_request_alone(
    deps: CheckpointDeps, uow: Any, clock: Any
) -> None:
    """Run 1 was preempted; the job was admitted and placed again; run 1's `job_finished` comes again
    (a redelivery, or another consumer's lag). It must not end run 2 nor cancel run 2's request."""
    spec = a_job("train").with_(checkpointable=True).build()
    start = clock()
    await handle(on.on_job_admitted(deps), JobAdmitted(job_id=JOB, spec=spec, submitted_at=start), uow)
    first_end = JobFinished(job_id=JOB, state="preempted", reason="preempted", at=clock.advance(5))
    await handle(on.on_job_finished(deps), first_end, uow)
    again = JobAdmitted(job_id=JOB, spec=spec, submitted_at=start)
    await handle(on.on_job_admitted(deps), again, uow, at=clock.advance(5))
    await handle(on.on_gang_placed(deps), placed("n0"), uow, at=clock.advance(1))
    command = await ask(deps, uow)

    await handle(on.on_job_finished(deps), first_end, uow)

    job = uow.stored.jobs[JOB]
    assert not job.finished and job.pods == {f"{JOB}-0": "n0"}
    assert uow.stored.requests[command.request_id].state is RequestState.SAVING, "still open"


async def test_an_earlier_admission_delivered_late_does_not_undo_the_latest_one(
    deps: CheckpointDeps, uow: Any, clock: Any
) -> None:
    start = clock()
    plain = a_job("train").with_(checkpointable=False).build()
    saving = a_job("train").with_(checkpointable=True).build()
    first = JobAdmitted(job_id=JOB, spec=plain, submitted_at=start)
    await handle(on.on_job_admitted(deps), first, uow, at=start)
    await handle(
        on.on_job_admitted(deps),
        JobAdmitted(job_id=JOB, spec=saving, submitted_at=start),
        uow,
        at=clock.advance(5),
    )
    latest = uow.stored.jobs[JOB].admitted_at

    await handle(on.on_job_admitted(deps), first, uow, at=start)  # run 1's admission, again

    job = uow.stored.jobs[JOB]
    assert (job.checkpointable, job.admitted_at) == (True, latest)
