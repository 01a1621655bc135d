"""The Event that tells of a job's objects suspended by a preemption (or unsuspended by an admission)
is not lost to a crash between the change on the cluster and the Event: the next round, which finds
the change made already, tells it. Each Event is named for its change, so a round cut short after it
told the Event, before it recorded the change, does not tell it twice; the next change gets another."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tessera.admission.domain.model import JobState
from tessera.admission.domain.workload_sync import DNS_SUBDOMAIN, Applied, Owner, WorkloadDue
from tessera.admission.service_layer.workload_sync import apply

T1 = datetime(2026, 11, 24, 5, tzinfo=UTC)


class Killed(Exception):
    """The process dies here."""


class Cluster:
    """Jobs and JobSets by name with their suspension, and Events by name as the API server keeps
    them (creating one of a name that exists changes nothing)."""

    def __init__(self) -> None:
        self.suspended: dict[str, bool] = {"train-0": False, "gang": False}
        self.events: dict[str, tuple[str, str]] = {}
        self.killed_at_event = False

    async def set_suspended(
        self, namespace: str, jobs: Sequence[str], suspended: bool, placements: Any = None
    ) -> list[str]:
        changed = [j for j in jobs if self.suspended[j] != suspended]
        self.suspended.update(dict.fromkeys(jobs, suspended))
        return changed

    async def set_jobset_suspended(self, namespace: str, name: str, suspended: bool, placements: Any) -> bool:
        return bool(await self.set_suspended(namespace, [name], suspended))

    async def event(
        self,
        namespace: str,
        job: str,
        kind: str,
        reason: str,
        message: str,
        involved: str = "Job",
        name: str | None = None,
    ) -> None:
        if self.killed_at_event:
            raise Killed
        assert name is not None, "every Event of a change is named for it"
        self.events.setdefault(name, (job, reason))


def preempted(kind: str, name: str, recorded_at: datetime) -> WorkloadDue:
    """A job asked to leave: its objects ran (so recorded at ``recorded_at``) and are to be suspended."""
    owner = Owner.USER if kind == "JobSet" else Owner.TESSERA
    return WorkloadDue(
        "job-1", JobState.QUEUED, None, "ml", ((kind, name),), Applied.RUNNING, Applied.SUSPENDED, owner,
        ("a100",), recorded_at,
    )  # fmt: skip


@pytest.mark.parametrize(("kind", "name"), [("Job", "train-0"), ("JobSet", "gang")])
async def test_a_suspension_is_told_once_though_the_round_died_before_or_after_telling_it(
    kind: str, name: str
) -> None:
    cluster = Cluster()
    item = preempted(kind, name, T1)
    cluster.killed_at_event = True
    with pytest.raises(Killed):
        await apply(item, cluster, "tessera")  # type: ignore[arg-type]
    assert cluster.suspended[name] is True and cluster.events == {}, (
        "suspended, nothing told, nothing recorded"
    )

    cluster.killed_at_event = False
    outcome = await apply(item, cluster, "tessera")  # type: ignore[arg-type]
    assert outcome.applied is Applied.SUSPENDED
    assert list(cluster.events.values()) == [(name, "Preempted")], "the next round tells it"
    await apply(item, cluster, "tessera")  # type: ignore[arg-type]  # died before recording, once more
    assert len(cluster.events) == 1, "told once"

    # Admitted again, then preempted again: other changes, other Events.
    cluster.suspended[name] = False
    await apply(preempted(kind, name, T1 + timedelta(minutes=5)), cluster, "tessera")  # type: ignore[arg-type]
    assert [reason for _, reason in cluster.events.values()] == ["Preempted", "Preempted"]


@pytest.mark.parametrize("cut_at", ["-", ".", "---"])
def test_an_event_on_a_long_name_cut_at_a_separator_is_still_a_valid_name(cut_at: str) -> None:
    """An object's name of up to 253 characters cut at 200 where a `-` or `.` falls would end in it,
    which the API server refuses (422), failing the job's every round."""
    obj = "b" * (200 - len(cut_at)) + cut_at + "c" * 40
    assert obj[:200].endswith(cut_at) and DNS_SUBDOMAIN.fullmatch(obj) and len(obj) <= 253
    item = preempted("Job", obj, T1)
    name = item.event_name(obj, "Preempted")
    assert DNS_SUBDOMAIN.fullmatch(name) and len(name) <= 253, name
    assert name.startswith(obj[:200].rstrip("-.") + ".")
    assert name == item.event_name(obj, "Preempted") != item.event_name(obj, "Admitted")


def test_an_event_on_a_short_name_begins_with_the_name() -> None:
    item = preempted("Job", "train-0", T1)
    head, digest = item.event_name("train-0", "Admitted").rsplit(".", 1)
    assert head == "train-0" and len(digest) == 16
    odd = item.event_name("Not_A.Name-", "Admitted")
    assert DNS_SUBDOMAIN.fullmatch(odd) and odd.startswith("not-a-name."), odd
