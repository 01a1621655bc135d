"""Reconciliation proposes a repair only where the cluster leaves no doubt about a job."""

from __future__ import annotations

import pytest

from tessera.admission.domain.model import JobState
from tessera.admission.domain.reconcile import ClusterView, Proposal, Repair, expected_pods, propose
from tessera.admission.domain.workloads import groups_of
from tessera.contracts.jobs import JobSpec

HOLDING = [JobState.ADMITTED, JobState.PLACED, JobState.RUNNING]


def view(*phases: str, jobs: int = 1) -> ClusterView:
    return ClusterView(tuple(phases), jobs)


@pytest.mark.parametrize("state", HOLDING)
def test_every_pod_succeeded_ends_the_job_succeeded(state: JobState) -> None:
    assert propose(state, 2, view("Succeeded", "Succeeded"), True) == Proposal(
        Repair.SUCCEEDED, "all 2 pods Succeeded"
    )


@pytest.mark.parametrize("state", HOLDING)
def test_every_pod_ended_with_a_failure_ends_the_job_failed(state: JobState) -> None:
    assert propose(state, 2, view("Succeeded", "Failed"), True) == Proposal(
        Repair.FAILED, "all 2 pods ended, 1 Failed"
    )


@pytest.mark.parametrize("state", [JobState.ADMITTED, JobState.PLACED])
def test_every_pod_running_makes_an_admitted_or_placed_job_running(state: JobState) -> None:
    assert propose(state, 2, view("Running", "Running"), True) == Proposal(
        Repair.RUNNING, "all 2 pods Running"
    )


def test_a_running_job_with_running_pods_is_left_alone() -> None:
    assert propose(JobState.RUNNING, 2, view("Running", "Running"), True) is None


@pytest.mark.parametrize(
    "seen",
    [
        view("Running"),  # one of two pods made so far
        view("Running", "Pending"),
        view("Succeeded", "Running"),
        view("Succeeded"),
        view(jobs=1),
    ],
)
@pytest.mark.parametrize("state", HOLDING)
def test_a_partial_picture_proposes_nothing(state: JobState, seen: ClusterView) -> None:
    assert propose(state, 2, seen, True) is None


@pytest.mark.parametrize(
    "state", [JobState.QUEUED, JobState.SUCCEEDED, JobState.CANCELLED, JobState.PREEMPTED]
)
def test_a_job_that_holds_no_quota_is_never_repaired(state: JobState) -> None:
    assert propose(state, 2, view("Succeeded", "Succeeded"), True) is None
    assert propose(state, 2, view(jobs=0), True) is None


def test_an_admitted_job_whose_objects_are_gone_has_them_made_again() -> None:
    assert propose(JobState.ADMITTED, 2, view(jobs=0), True) == Proposal(
        Repair.RECREATE, "its Kubernetes Jobs are gone from the API"
    )


def test_objects_not_made_yet_or_pods_left_or_a_placed_job_are_not_made_again() -> None:
    assert propose(JobState.ADMITTED, 2, view(jobs=0), False) is None, "the sync has not made them yet"
    assert propose(JobState.ADMITTED, 2, view("Pending", jobs=0), True) is None, "its pods are still there"
    assert propose(JobState.PLACED, 2, view(jobs=0), True) is None, "the scheduler placed it: events decide"


def test_a_job_without_pods_is_left_alone() -> None:
    assert expected_pods({}) == 0
    assert propose(JobState.ADMITTED, 0, view("Succeeded"), True) is None


def test_every_replica_of_every_group_is_expected() -> None:
    spec = JobSpec.model_validate(
        {
            "name": "t",
            "tenant": "t",
            "pod_groups": [{"name": "a", "replicas": 2}, {"name": "b", "replicas": 3}],
        }
    )
    assert expected_pods({"groups": groups_of(spec)}) == 5
