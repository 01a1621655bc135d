"""What a job holding quota should become, from what the cluster shows of it. Pure.

Events keep admission's view of a job in step with the cluster, but an event can be lost to a bug, an
operator's purge or a crash between two systems. Reconciliation compares the view with the cluster
now and then and proposes a repair only where the cluster leaves no doubt: every pod of the job
ended, or every pod runs, or the job's objects are gone while it is admitted. Anything less (some
pods pending, some ended) is left to the events, which are still on their way."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tessera.admission.domain.model import HOLDS_QUOTA, JobState

SUCCEEDED, FAILED, RUNNING = "Succeeded", "Failed", "Running"


class Repair(StrEnum):
    RUNNING = "running"
    """Every pod runs; admission still had the job admitted or placed."""
    SUCCEEDED = "succeeded"
    """Every pod ended Succeeded; admission still had the job holding quota."""
    FAILED = "failed"
    """Every pod ended, some Failed; admission still had the job holding quota."""
    RECREATE = "recreate"
    """The job is admitted and admission made its objects, but the API has none of them."""


@dataclass(frozen=True)
class ClusterView:
    """What the API shows of one job: the phase of each pod labelled with its id, and how many
    batch/v1 Jobs carry that label."""

    pods: tuple[str, ...] = ()
    jobs: int = 0


@dataclass(frozen=True)
class Proposal:
    repair: Repair
    reason: str


def expected_pods(workload: Mapping[str, Any]) -> int:
    """How many pods the job runs (every replica of every pod group, as `groups_of` counts them)."""
    return sum(int(group["count"]) for group in workload.get("groups", ()))


def propose(state: JobState, expected: int, seen: ClusterView, objects_made: bool) -> Proposal | None:
    """The repair the cluster calls for, or None. ``objects_made``: admission made the job's objects
    and unsuspended them (so their absence is news, not a round still to come)."""
    if state not in HOLDS_QUOTA or expected <= 0:
        return None
    phases = Counter(seen.pods)
    count = len(seen.pods)
    if count >= expected:
        if phases[SUCCEEDED] == count:
            return Proposal(Repair.SUCCEEDED, f"all {count} pods Succeeded")
        if phases[SUCCEEDED] + phases[FAILED] == count:
            return Proposal(Repair.FAILED, f"all {count} pods ended, {phases[FAILED]} Failed")
        if phases[RUNNING] == count and state is not JobState.RUNNING:
            return Proposal(Repair.RUNNING, f"all {count} pods Running")
    if state is JobState.ADMITTED and objects_made and seen.jobs == 0 and count == 0:
        return Proposal(Repair.RECREATE, "its Kubernetes Jobs are gone from the API")
    return None
