from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tessera.admission.domain.model import InvalidTransition, Job, JobState
from tessera.contracts.base import FieldError
from tessera.contracts.events import JobAccepted, JobAdmitted, JobFinished, JobRejected, JobStateChanged
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
