"""A job's Jobs that admission made and someone deleted before the round that unsuspends (or suspends)
them are made again by that round, not refused in every round from then on: reconciliation makes
again only the objects of a job that ran, so a job whose suspended Jobs were deleted while it queued
would otherwise hold its quota once admitted and never run. A user's own Job that is gone is its
owner's deletion, and stays so."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from tessera.admission.domain.kube_objects import JobObjects
from tessera.admission.domain.model import JobState
from tessera.admission.domain.workload_sync import Applied, Owner, WorkloadDue
from tessera.admission.service_layer.ports import WorkloadGone
from tessera.admission.service_layer.workload_sync import apply
from tessera.contracts.jobs import JobSpec

T1 = datetime(2026, 11, 24, 5, tzinfo=UTC)
SPEC = JobSpec.model_validate(
    {
        "name": "llama",
        "tenant": "research",
        "estimated_duration_s": 60,
        "pod_groups": [
            {
                "name": "worker",
                "replicas": 2,
                "gpu": {"count": 1},
                "template": {"spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]}},
            }
        ],
    }
)
JOB = "llama-job1-worker"


class Cluster:
    """Jobs by name with their suspension, as the API server keeps them: creating one that exists
    changes nothing, and a change to one that does not exist is refused as gone."""

    def __init__(self) -> None:
        self.suspended: dict[str, bool] = {}
        self.created = 0

    async def create(self, objects: JobObjects) -> None:
        self.created += 1
        for job in objects.jobs:
            self.suspended.setdefault(job["metadata"]["name"], bool(job["spec"]["suspend"]))

    async def set_suspended(
        self, namespace: str, jobs: Sequence[str], suspended: bool, placements: Any = None
    ) -> list[str]:
        if gone := [j for j in jobs if j not in self.suspended]:
            raise WorkloadGone(f"job {namespace}/{gone[0]} is gone from the cluster")
        changed = [j for j in jobs if self.suspended[j] != suspended]
        self.suspended.update(dict.fromkeys(jobs, suspended))
        return changed

    async def event(self, *args: Any, **kwargs: Any) -> None:
        pass


def due(state: JobState, applied: Applied, want: Applied, owner: Owner = Owner.TESSERA) -> WorkloadDue:
    return WorkloadDue(
        "job-1", state, SPEC, "ml", (("Service", "llama-job1"), ("Job", JOB)), applied, want, owner,
        (), T1,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("state", "applied", "want"),
    [
        (JobState.ADMITTED, Applied.SUSPENDED, Applied.RUNNING),  # deleted while it queued
        (JobState.QUEUED, Applied.RUNNING, Applied.SUSPENDED),  # deleted before its preemption
    ],
)
async def test_jobs_admission_made_and_someone_deleted_are_made_again_by_the_round(
    state: JobState, applied: Applied, want: Applied
) -> None:
    cluster = Cluster()  # the Jobs were made once and are gone now
    outcome = await apply(due(state, applied, want), cluster, "tessera")  # type: ignore[arg-type]
    assert cluster.created == 1, "made again"
    assert cluster.suspended == {JOB: want is Applied.SUSPENDED}
    assert (outcome.namespace, outcome.applied) == ("ml", want)
    assert ("Job", JOB) in outcome.objects

    again = await apply(due(state, want, want), cluster, "tessera")  # type: ignore[arg-type]
    assert cluster.created == 1 and again.applied is want, "found as wanted: nothing made twice"


async def test_a_users_job_that_is_gone_is_its_owners_deletion() -> None:
    cluster = Cluster()
    item = due(JobState.ADMITTED, Applied.SUSPENDED, Applied.RUNNING, Owner.USER)
    outcome = await apply(item, cluster, "tessera")  # type: ignore[arg-type]
    assert outcome.applied is Applied.DELETED and cluster.created == 0 and cluster.suspended == {}
