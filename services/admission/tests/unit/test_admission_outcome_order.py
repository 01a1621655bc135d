"""The scheduler's news of a job (placed, running, ended) comes on two streams, so admission may hear
it in any order and more than once. Every order ends in the same state, each step is recorded once,
and news that comes late or twice changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from itertools import permutations

import pytest

from tessera.admission.domain.model import InvalidTransition, Job, JobState
from tessera.contracts.events import JobFinished
from tessera.contracts.jobs import JobSpec

NOW = datetime(2026, 11, 21, tzinfo=UTC)
SPEC = JobSpec.model_validate({"name": "train", "tenant": "t", "pod_groups": [{"name": "w", "replicas": 2}]})

News = Callable[[Job], bool]


def placed(job: Job) -> bool:
    return job.place(2, ["gpu-1"], NOW)


def running(job: Job) -> bool:
    return job.report(JobState.RUNNING, "all 2 pods running", NOW)


def succeeded(job: Job) -> bool:
    return job.report(JobState.SUCCEEDED, "every pod ended: Succeeded", NOW)


def failed(job: Job) -> bool:
    return job.report(JobState.FAILED, "every pod ended: Failed", NOW)


def admitted_job() -> Job:
    job = Job.submit("j1", SPEC, NOW)
    job.admit(NOW, "admitted", ("a100",))
    job.events.clear()
    return job


def after_admission(job: Job) -> list[JobState]:
    states = [t.state for t in job.history]
    return states[states.index(JobState.ADMITTED) + 1 :]


@pytest.mark.parametrize(
    "order", list(permutations([placed, running])), ids=lambda o: "-".join(n.__name__ for n in o)
)
def test_placed_and_running_in_either_order_leave_the_job_running(order: tuple[News, ...]) -> None:
    job = admitted_job()
    for news in order:
        news(job)
    assert job.state is JobState.RUNNING
    assert after_admission(job) == [JobState.PLACED, JobState.RUNNING]
    assert job.holds_quota and not [e for e in job.events if isinstance(e, JobFinished)]


@pytest.mark.parametrize(
    "order", list(permutations([placed, running, succeeded])), ids=lambda o: "-".join(n.__name__ for n in o)
)
def test_every_order_of_placed_running_succeeded_ends_succeeded_once(order: tuple[News, ...]) -> None:
    job = admitted_job()
    for news in order:
        news(job)
    assert job.state is JobState.SUCCEEDED
    steps = after_admission(job)
    assert steps[0] is JobState.PLACED and steps[-1] is JobState.SUCCEEDED
    assert steps in (
        [JobState.PLACED, JobState.SUCCEEDED],
        [JobState.PLACED, JobState.RUNNING, JobState.SUCCEEDED],
    )
    assert [e.state for e in job.events if isinstance(e, JobFinished)] == ["succeeded"]


@pytest.mark.parametrize(
    "order", list(permutations([placed, running, failed])), ids=lambda o: "-".join(n.__name__ for n in o)
)
def test_every_order_of_placed_running_failed_ends_failed_once(order: tuple[News, ...]) -> None:
    job = admitted_job()
    for news in order:
        news(job)
    assert job.state is JobState.FAILED
    assert after_admission(job)[-1] is JobState.FAILED
    assert [e.state for e in job.events if isinstance(e, JobFinished)] == ["failed"]


def test_running_first_records_the_placement_as_implied_and_the_late_placement_changes_nothing() -> None:
    job = admitted_job()
    assert running(job) is True
    assert [(t.state, t.reason) for t in job.history[-2:]] == [
        (JobState.PLACED, "placed: implied by the running report that came first"),
        (JobState.RUNNING, "all 2 pods running"),
    ]
    events = len(job.events)
    assert placed(job) is False
    assert len(job.events) == events and job.state is JobState.RUNNING


@pytest.mark.parametrize("news", [placed, running, succeeded, failed], ids=lambda n: n.__name__)
def test_news_heard_twice_is_applied_once(news: News) -> None:
    job = admitted_job()
    assert news(job) is True
    history, events = len(job.history), len(job.events)
    assert news(job) is False
    assert (len(job.history), len(job.events)) == (history, events)


def test_the_first_end_stands() -> None:
    job = admitted_job()
    placed(job)
    succeeded(job)
    assert failed(job) is False and job.state is JobState.SUCCEEDED


@pytest.mark.parametrize("news", [placed, running, succeeded], ids=lambda n: n.__name__)
def test_news_of_an_earlier_admission_is_refused_while_the_job_queues(news: News) -> None:
    job = Job.submit("j1", SPEC, NOW)
    with pytest.raises(InvalidTransition):
        news(job)
    assert job.state is JobState.QUEUED


def test_a_cancelled_job_stays_cancelled_whatever_comes_late() -> None:
    job = admitted_job()
    job.cancel("cancelled by request", NOW)
    for news in (placed, running, succeeded):
        with pytest.raises(InvalidTransition):
            news(job)
    assert job.state is JobState.CANCELLED
