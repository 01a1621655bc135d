from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tessera.admission.domain.model import InvalidTransition, Job, JobCheckpoint, JobState
from tessera.contracts.base import FieldError
from tessera.contracts.events import (
    JobAccepted,
    JobAdmitted,
    JobFinished,
    JobRejected,
    JobStateChanged,
    PreemptionRequested,
)
from tessera.contracts.jobs import JobSpec

NOW = datetime(2026, 11, 21, tzinfo=UTC)
SPEC = JobSpec.model_validate({"name": "train", "tenant": "t", "pod_groups": [{"name": "w", "replicas": 1}]})


def test_a_submitted_job_is_queued_and_announced() -> None:
    job = Job.submit("j1", SPEC, NOW)
    assert job.state == JobState.QUEUED
    assert [t.state for t in job.history] == [JobState.SUBMITTED, JobState.QUEUED]
    assert job.events[0] == JobAccepted(job_id="j1", name="train", tenant="t", queue="default")
    changed = job.events[1]
    assert isinstance(changed, JobStateChanged)
    assert (changed.previous_state, changed.state) == ("submitted", "queued")


def test_a_rejected_job_keeps_its_errors_and_its_reason_names_the_fields() -> None:
    errors = [FieldError(field="name", reason="must be a DNS label")]
    job = Job.reject("j2", {"name": "Bad", "tenant": "t"}, errors, NOW)
    assert job.state == JobState.REJECTED
    assert "name: must be a DNS label" in job.history[-1].reason
    assert job.events[0] == JobRejected(job_id="j2", name="Bad", errors=errors)
    assert [type(e) for e in job.events[1:]] == [JobStateChanged]


def test_admission_emits_job_admitted_with_the_spec() -> None:
    job = Job.submit("j1", SPEC, NOW)
    job.events.clear()
    job.admit(NOW)
    assert job.state == JobState.ADMITTED
    assert job.events[-1] == JobAdmitted(job_id="j1", spec=SPEC, submitted_at=NOW)
    assert [type(e) for e in job.events] == [JobStateChanged, JobAdmitted]


@pytest.mark.parametrize(
    ("path", "final", "announced"),
    [
        ([JobState.ADMITTED, JobState.PLACED, JobState.RUNNING], JobState.SUCCEEDED, True),
        ([JobState.ADMITTED], JobState.PREEMPTED, True),
        ([], JobState.CANCELLED, True),
        ([JobState.ADMITTED], JobState.PLACED, False),
    ],
)
def test_leaving_quota_is_announced_as_job_finished(
    path: list[JobState], final: JobState, announced: bool
) -> None:
    job = Job.submit("j1", SPEC, NOW)
    for state in path:
        job.move(state, "test", NOW)
    job.events.clear()
    job.move(final, "why", NOW)
    finished = [e for e in job.events if isinstance(e, JobFinished)]
    assert finished == (
        [JobFinished(job_id="j1", state=final.value, reason="why", at=NOW)] if announced else []
    )


def test_a_note_keeps_the_state_and_records_the_reason() -> None:
    job = Job.submit("j1", SPEC, NOW)
    job.note("waiting: QuotaExhausted: no unused quota", NOW)
    assert job.state == JobState.QUEUED
    assert job.history[-1].reason == "waiting: QuotaExhausted: no unused quota"
    assert isinstance(job.events[-1], JobStateChanged)


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ([], JobState.PLACED),
        ([JobState.ADMITTED, JobState.PLACED, JobState.RUNNING, JobState.SUCCEEDED], JobState.RUNNING),
        ([JobState.CANCELLED], JobState.QUEUED),
    ],
)
def test_transitions_outside_the_lifecycle_are_refused(path: list[JobState], target: JobState) -> None:
    job = Job.submit("j1", SPEC, NOW)
    for state in path:
        job.move(state, "test", NOW)
    with pytest.raises(InvalidTransition, match=f"cannot move from {job.state} to {target}"):
        job.move(target, "test", NOW)


def admitted_job() -> Job:
    job = Job.submit("j1", SPEC, NOW)
    job.admit(NOW, "admitted to queue default in flavor a100", ("a100",))
    job.events.clear()
    return job


def test_admission_records_the_flavors_and_clears_the_wait() -> None:
    job = Job.submit("j1", SPEC, NOW)
    job.wait("QuotaExhausted", "no unused quota", NOW)
    job.admit(NOW, "admitted", ("a100",))
    assert (job.flavors, job.admitted_at, job.waiting) == (("a100",), NOW, None)


def test_only_a_new_wait_reason_is_news_and_only_a_queued_job_waits() -> None:
    job = Job.submit("j1", SPEC, NOW)
    job.events.clear()
    job.wait("QuotaExhausted", "no unused quota", NOW)
    job.wait("QuotaExhausted", "no unused quota", NOW)
    assert [e.reason for e in job.events] == ["waiting: QuotaExhausted: no unused quota"]
    job.wait("NoFeasiblePlacement", "no room", NOW)
    assert job.waiting == ("NoFeasiblePlacement", "no room") and len(job.events) == 2
    running = admitted_job()
    running.wait("QuotaExhausted", "no unused quota", NOW)
    assert running.events == [] and running.waiting is None


def test_a_preemption_request_keeps_the_job_running_and_names_who_wants_its_quota() -> None:
    job = admitted_job()
    deadline = NOW + timedelta(seconds=90)
    job.request_preemption("urgent", "InQueuePriority", 30.0, deadline, True, NOW)
    assert (job.state, job.preempted_by, job.preemption_deadline) == (JobState.ADMITTED, "urgent", deadline)
    requested, noted = job.events
    assert requested == PreemptionRequested(
        victim_job_id="j1",
        preemptor_job_id="urgent",
        reason="InQueuePriority",
        deadline=deadline,
        grace_period_s=30.0,
        checkpointable=True,
    )
    assert isinstance(noted, JobStateChanged) and noted.state == noted.previous_state == "admitted"


def test_a_forced_preemption_ends_the_job_frees_its_quota_and_queues_it_again() -> None:
    job = admitted_job()
    job.preempt("urgent", "InQueuePriority", 0.0, NOW, False, NOW)
    assert [t.state for t in job.history[-2:]] == [JobState.PREEMPTED, JobState.QUEUED]
    assert job.history[-1].reason == "requeued after preemption"
    assert [type(e) for e in job.events] == [
        PreemptionRequested,
        JobStateChanged,
        JobFinished,
        JobStateChanged,
    ]
    assert isinstance(job.events[0], PreemptionRequested) and job.events[0].forced
    assert (job.state, job.preempted_by, job.flavors, job.admitted_at) == (JobState.QUEUED, None, (), None)


@pytest.mark.parametrize("ask", ["request_preemption", "preempt"])
def test_a_job_that_holds_no_quota_cannot_be_preempted(ask: str) -> None:
    job = Job.submit("j1", SPEC, NOW)
    with pytest.raises(InvalidTransition, match="holds quota"):
        getattr(job, ask)("urgent", "InQueuePriority", 0.0, NOW, False, NOW)
    assert job.state is JobState.QUEUED


def test_the_scheduler_places_only_an_admitted_job() -> None:
    job = admitted_job()
    job.place(2, ["gpu-2", "gpu-1", "gpu-2"], NOW)
    assert job.history[-1].reason == "placed 2 pods on gpu-1, gpu-2"
    assert job.place(2, ["gpu-1"], NOW) is False, "placed again: a repeat, not a change"
    assert job.history[-1].reason == "placed 2 pods on gpu-1, gpu-2"
    with pytest.raises(InvalidTransition, match="no longer waits for a placement"):
        job.unschedulable("0/4 nodes fit", NOW)


def test_a_release_after_a_preemption_request_names_the_preemptor_and_queues_the_job_again() -> None:
    job = admitted_job()
    job.request_preemption("urgent", "InQueuePriority", 30.0, NOW, False, NOW)
    job.report(JobState.PREEMPTED, "", NOW)
    assert [(t.state, t.reason) for t in job.history[-2:]] == [
        (JobState.PREEMPTED, "released after preemption by urgent"),
        (JobState.QUEUED, "requeued after preemption"),
    ]
    # Admitted again, a late release meant for the earlier admission changes nothing.
    job.admit(NOW, "admitted again")
    with pytest.raises(InvalidTransition, match="no preemption was requested"):
        job.report(JobState.PREEMPTED, "1 pods evicted", NOW)
    assert job.state is JobState.ADMITTED


def test_a_job_records_its_checkpoints_and_resumes_from_the_newest_when_admitted_again() -> None:
    job = admitted_job()
    first = JobCheckpoint("c1", 100, 2**20, "file:///ckpt/j1/step-100-a", NOW + timedelta(minutes=5))
    second = JobCheckpoint("c2", 180, 2**20, "file:///ckpt/j1/step-180-b", NOW + timedelta(minutes=9))
    job.events.clear()
    job.checkpoint_saved(second, NOW + timedelta(minutes=9))
    job.checkpoint_saved(first, NOW + timedelta(minutes=10))  # announced late: older, it changes nothing
    assert job.latest_checkpoint == second
    assert [t.reason for t in job.history[-2:]] == [
        "checkpoint saved at step 180 (file:///ckpt/j1/step-180-b)",
        "checkpoint saved at step 100 (file:///ckpt/j1/step-100-a)",
    ]
    assert all(isinstance(e, JobStateChanged) and e.state == "admitted" for e in job.events)

    job.request_preemption("urgent", "InQueuePriority", 120.0, NOW, True, NOW)
    job.report(JobState.PREEMPTED, "1 pods evicted", NOW)
    job.events.clear()
    job.admit(NOW, "admitted to queue q in flavor a100")

    (admitted,) = [e for e in job.events if isinstance(e, JobAdmitted)]
    assert admitted.resume_from == "file:///ckpt/j1/step-180-b"
    assert job.history[-1].reason == (
        "admitted to queue q in flavor a100; resumes from the checkpoint at step 180 (file:///ckpt/j1/step-180-b)"
    )


def test_a_job_without_a_checkpoint_is_admitted_with_nothing_to_resume_from() -> None:
    job = Job.submit("j1", SPEC, NOW)
    job.admit(NOW)
    (admitted,) = [e for e in job.events if isinstance(e, JobAdmitted)]
    assert admitted.resume_from is None
