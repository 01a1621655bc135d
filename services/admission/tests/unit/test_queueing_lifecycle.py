"""The job lifecycle: allowed transitions only, each recorded with time and reason."""

from __future__ import annotations

import pytest

from tessera.admission.domain.queueing import InvalidTransition, JobLifecycle, JobState

S = JobState


@pytest.mark.parametrize(
    "path",
    [
        pytest.param([S.QUEUED, S.ADMITTED, S.PLACED, S.RUNNING, S.SUCCEEDED], id="happy path"),
        pytest.param(
            [S.QUEUED, S.ADMITTED, S.PLACED, S.RUNNING, S.PREEMPTED, S.QUEUED], id="preempted, requeued"
        ),
        pytest.param([S.QUEUED, S.ADMITTED, S.QUEUED], id="admission rolled back"),
        pytest.param([S.QUEUED, S.CANCELLED], id="cancelled while queued"),
        pytest.param([S.FAILED], id="rejected on submit"),
        pytest.param([S.QUEUED, S.ADMITTED, S.PLACED, S.RUNNING, S.FAILED], id="failed while running"),
    ],
)
def test_allowed_paths_are_recorded_with_time_and_reason(path: list[JobState]) -> None:
    job = JobLifecycle("train-1")
    for t, state in enumerate(path):
        job.move_to(state, at=float(t), reason=f"to {state}")
    assert job.state is path[-1]
    assert [(tr.source, tr.target) for tr in job.history] == list(
        zip([S.SUBMITTED, *path[:-1]], path, strict=True)
    )
    assert [tr.at for tr in job.history] == [float(t) for t in range(len(path))]
    assert job.history[-1].reason == f"to {path[-1]}"


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        pytest.param([S.QUEUED], S.RUNNING, id="queued cannot run before admission"),
        pytest.param([], S.ADMITTED, id="submitted must be queued first"),
        pytest.param([S.QUEUED, S.ADMITTED, S.PLACED, S.RUNNING, S.SUCCEEDED], S.QUEUED, id="terminal"),
        pytest.param([S.QUEUED, S.CANCELLED], S.RUNNING, id="cancelled is terminal"),
        pytest.param([S.QUEUED, S.ADMITTED, S.PLACED, S.RUNNING], S.PLACED, id="no going back to placed"),
    ],
)
def test_invalid_transition_raises_a_clear_error(path: list[JobState], bad: JobState) -> None:
    job = JobLifecycle("train-1")
    for t, state in enumerate(path):
        job.move_to(state, at=float(t), reason="ok")
    with pytest.raises(InvalidTransition) as err:
        job.move_to(bad, at=99.0, reason="nope")
    message = str(err.value)
    assert "train-1" in message and f"from {job.state.value} to {bad.value}" in message
    assert "allowed next states" in message
    assert job.state is (path[-1] if path else S.SUBMITTED)
    assert len(job.history) == len(path)


def test_terminal_states_say_so() -> None:
    job = JobLifecycle("j")
    job.move_to(S.QUEUED, 0.0, "validated")
    job.move_to(S.CANCELLED, 1.0, "user asked")
    assert job.is_terminal
    with pytest.raises(InvalidTransition, match="none \\(terminal state\\)"):
        job.move_to(S.QUEUED, 2.0, "again")


def test_a_transition_needs_a_reason() -> None:
    with pytest.raises(ValueError, match="reason"):
        JobLifecycle("j").move_to(S.QUEUED, 0.0, "")
