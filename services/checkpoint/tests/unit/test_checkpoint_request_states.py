"""The checkpoint request's state machine: what each transition announces, what it refuses, and that a
request ends with exactly one `ready_for_eviction` however many reports arrive."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tessera.checkpoint.domain.model import (
    OPEN_STATES,
    TRANSITIONS,
    Answer,
    Checkpoint,
    CheckpointRequest,
    InvalidTransition,
    Job,
    RequestState,
    checkpoint_id,
)
from tessera.contracts.events import (
    CheckpointFailed,
    CheckpointSaved,
    ReadyForEviction,
    ReportCheckpoint,
    SaveCheckpoint,
)

T0 = datetime(2026, 11, 24, 9, 0, tzinfo=UTC)
DEADLINE = T0 + timedelta(seconds=30)


def a_request(request_id: str = "r1", job_id: str = "job-1") -> CheckpointRequest:
    return CheckpointRequest.ask(request_id, job_id, "preemption", DEADLINE, T0, preemptor_job_id="urgent")


def earlier(step: int = 5) -> Checkpoint:
    """A checkpoint the job saved before (periodic)."""
    return Checkpoint.reported(report(request_id=None, uri=f"file:///ckpt/job-1/s{step}", step=step))


def report(
    outcome: str = "saved", request_id: str | None = "r1", uri: str = "file:///ckpt/job-1/s10", step: int = 10
) -> ReportCheckpoint:
    return ReportCheckpoint.model_validate(
        {
            "job_id": "job-1",
            "request_id": request_id,
            "outcome": outcome,
            "step": step,
            "size_bytes": 4096,
            "uri": uri if outcome == "saved" else "",
            "reason": "requested" if outcome == "saved" else "OSError: disk full",
            "at": T0 + timedelta(seconds=5),
        }
    )


def ended(request: CheckpointRequest) -> list[object]:
    """The events recorded, then cleared (as a commit collects them)."""
    events, request.events = request.events, []
    return events


def test_a_new_request_is_sent_to_the_trainer_and_is_saving() -> None:
    request = a_request()
    assert request.state is RequestState.SAVING and request.is_open
    assert ended(request) == [
        SaveCheckpoint(job_id="job-1", request_id="r1", reason="preemption", deadline=DEADLINE)
    ]


def test_a_request_needs_a_deadline_ahead() -> None:
    with pytest.raises(ValueError, match="deadline"):
        CheckpointRequest.ask("r1", "job-1", "preemption", T0, T0)


def test_a_saved_report_ends_it_with_the_checkpoint_for_the_restart() -> None:
    request = a_request()
    ended(request)
    checkpoint = Checkpoint.reported(report())
    now = T0 + timedelta(seconds=6)
    assert request.answer(report(), checkpoint, checkpoint, now) is Answer.ANSWERED
    assert request.state is RequestState.SAVED and request.checkpoint_uri == "file:///ckpt/job-1/s10"
    assert ended(request) == [
        ReadyForEviction(
            job_id="job-1",
            request_id="r1",
            reason="checkpoint_saved",
            checkpoint_uri="file:///ckpt/job-1/s10",
            step=10,
            preemptor_job_id="urgent",
            cause="preemption",
            at=now,
        )
    ]


def test_the_checkpoint_announces_itself_once_with_the_step_and_the_size() -> None:
    checkpoint = Checkpoint.reported(report())
    assert checkpoint.id == checkpoint_id("job-1", "file:///ckpt/job-1/s10")
    assert checkpoint.events == [
        CheckpointSaved(
            job_id="job-1",
            request_id="r1",
            step=10,
            uri="file:///ckpt/job-1/s10",
            size_bytes=4096,
            at=T0 + timedelta(seconds=5),
        )
    ]
    with pytest.raises(ValueError, match="no checkpoint"):
        Checkpoint.reported(report("failed"))


def test_a_failed_report_ends_it_with_the_previous_checkpoint_if_any() -> None:
    request = a_request()
    ended(request)
    now = T0 + timedelta(seconds=6)
    assert request.answer(report("failed"), None, earlier(5), now) is Answer.ANSWERED
    assert request.state is RequestState.FAILED and request.outcome == "OSError: disk full"
    assert ended(request) == [
        CheckpointFailed(job_id="job-1", request_id="r1", reason="OSError: disk full", at=now),
        ReadyForEviction(
            job_id="job-1",
            request_id="r1",
            reason="checkpoint_failed",
            checkpoint_uri="file:///ckpt/job-1/s5",
            step=5,
            preemptor_job_id="urgent",
            cause="preemption",
            at=now,
        ),
    ]


def test_at_its_deadline_it_times_out_and_not_before() -> None:
    request = a_request()
    ended(request)
    with pytest.raises(InvalidTransition, match="ahead"):
        request.time_out(None, DEADLINE - timedelta(milliseconds=1))
    assert request.state is RequestState.SAVING and ended(request) == []
    request.time_out(None, DEADLINE)
    assert request.state is RequestState.TIMED_OUT
    assert ended(request) == [
        CheckpointFailed(job_id="job-1", request_id="r1", reason="checkpoint_timeout", at=DEADLINE),
        ReadyForEviction(
            job_id="job-1",
            request_id="r1",
            reason="checkpoint_timeout",
            preemptor_job_id="urgent",
            cause="preemption",
            at=DEADLINE,
        ),
    ]


def test_a_forced_preemption_overtakes_it_with_deadline_passed() -> None:
    request = a_request()
    ended(request)
    request.overtaken(earlier(3), T0)
    assert request.state is RequestState.TIMED_OUT
    [failed, ready] = ended(request)
    assert isinstance(failed, CheckpointFailed) and failed.reason == "deadline_passed"
    assert isinstance(ready, ReadyForEviction)
    assert (ready.reason, ready.checkpoint_uri, ready.step) == ("deadline_passed", "file:///ckpt/job-1/s3", 3)


def test_duplicate_and_late_reports_change_nothing() -> None:
    saved = a_request()
    checkpoint = Checkpoint.reported(report())
    saved.answer(report(), checkpoint, checkpoint, T0)
    ended(saved)
    assert saved.answer(report(), checkpoint, checkpoint, T0) is Answer.DUPLICATE
    assert saved.answer(report("failed"), None, None, T0) is Answer.DUPLICATE
    assert saved.state is RequestState.SAVED and ended(saved) == []

    timed_out = a_request()
    timed_out.time_out(None, DEADLINE)
    ended(timed_out)
    assert timed_out.answer(report(), checkpoint, checkpoint, DEADLINE) is Answer.LATE
    assert timed_out.state is RequestState.TIMED_OUT and ended(timed_out) == []


def test_a_report_for_another_request_is_refused() -> None:
    with pytest.raises(ValueError, match="not for r1"):
        a_request().answer(report(request_id="r2"), None, None, T0)


def test_an_ended_request_refuses_every_transition() -> None:
    request = a_request()
    request.cancel("job succeeded", T0)
    assert request.state is RequestState.CANCELLED
    assert [type(e) for e in ended(request)] == [SaveCheckpoint], "a cancelled request announces nothing"
    checkpoint = Checkpoint.reported(report())
    for transition in (
        lambda: request.saved(checkpoint, T0),
        lambda: request.failed("x", None, T0),
        lambda: request.time_out(None, DEADLINE),
        lambda: request.overtaken(None, T0),
        lambda: request.cancel("again", T0),
    ):
        with pytest.raises(InvalidTransition):
            transition()
    assert request.state is RequestState.CANCELLED and ended(request) == []


def test_the_table_only_leaves_open_states() -> None:
    assert set(TRANSITIONS) == OPEN_STATES
    ends = {RequestState.SAVED, RequestState.FAILED, RequestState.TIMED_OUT, RequestState.CANCELLED}
    assert set().union(*TRANSITIONS.values()) - {RequestState.SAVING} == ends


def test_an_open_request_answers_a_second_reason_by_the_earlier_deadline() -> None:
    request = a_request()
    assert not request.also_for(DEADLINE + timedelta(seconds=1), T0, preemptor_job_id="other")
    assert request.preemptor_job_id == "urgent", "the first preemption stays, as the scheduler keeps it"
    assert request.also_for(DEADLINE - timedelta(seconds=10), T0)
    assert request.deadline == DEADLINE - timedelta(seconds=10)
    request.time_out(None, DEADLINE)
    assert not request.also_for(T0, T0)


def test_a_request_for_a_node_signal_takes_the_preemption_that_comes_next() -> None:
    request = CheckpointRequest.ask("r1", "job-1", "spot_interruption", DEADLINE, T0)
    assert request.also_for(DEADLINE, T0, preemptor_job_id="urgent")
    request.time_out(None, DEADLINE)
    ready = request.events[-1]
    assert isinstance(ready, ReadyForEviction)
    assert (ready.preemptor_job_id, ready.cause) == ("urgent", "spot_interruption")


# -- the job -------------------------------------------------------------------------------------------
def test_news_older_than_the_jobs_end_is_ignored() -> None:
    job = Job("job-1")
    job.admitted(True, T0)
    assert job.placed({"p0": "n0", "p1": "n1"}, T0 + timedelta(seconds=1))
    assert job.nodes == {"n0", "n1"}
    job.finish(T0 + timedelta(seconds=10))
    assert job.pods == {} and job.finished
    assert not job.placed({"p0": "n0"}, T0 + timedelta(seconds=2)), "a placement delivered late"
    job.admitted(True, T0)
    assert job.finished, "an admission delivered late does not revive it"
    job.admitted(True, T0 + timedelta(seconds=20))
    assert not job.finished, "admitted again after a preemption"
    assert job.placed({"p0": "n2"}, T0 + timedelta(seconds=21))
    job.gang_ended(T0 + timedelta(seconds=3))
    assert job.pods == {"p0": "n2"}, "the end of the earlier gang does not remove the new one"
    job.gang_ended(T0 + timedelta(seconds=30))
    assert job.pods == {}


def test_a_job_released_without_a_checkpoint_says_why() -> None:
    job = Job("job-1", checkpointable=False)
    job.release_now("not_checkpointable", earlier(7), T0, cause="preemption", preemptor_job_id="urgent")
    assert job.events == [
        ReadyForEviction(
            job_id="job-1",
            reason="not_checkpointable",
            checkpoint_uri="file:///ckpt/job-1/s7",
            step=7,
            preemptor_job_id="urgent",
            cause="preemption",
            at=T0,
        )
    ]
