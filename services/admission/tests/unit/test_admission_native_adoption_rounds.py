"""Rounds of the adoption of users' workloads and of the workload sync, on in-memory repositories and
an in-memory cluster.

Two admission replicas adopt at once: a workload created after one replica's listing, which another
replica adopts before the first ends its round, is not cancelled as deleted (for Jobs, Pods and the
groups of LeaderWorkerSets); a workload deleted is. Jobs whose objects the cluster keeps refusing
do not take every round of the workload sync from the others. A LeaderWorkerSet group's Event told
again by a round after a crash is one Event."""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from tessera.admission.domain.job_conditions import ConditionsDue
from tessera.admission.domain.model import JobState
from tessera.admission.domain.workload_sync import Applied, Owner, WorkloadDue
from tessera.admission.service_layer.native_jobs import adopt_native_jobs
from tessera.admission.service_layer.native_lws import sync_lws_groups
from tessera.admission.service_layer.native_pods import adopt_native_pods
from tessera.admission.service_layer.ports import WorkloadError
from tessera.admission.service_layer.workload_sync import sync_workloads

from .conftest import FakeAdmissionUnitOfWork

IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
P = "leaderworkerset.sigs.k8s.io/"
QUEUES: dict[str, Any] = {
    "flavors": [{"name": "a100"}],
    "queues": [{"name": "team-a", "quotas": [{"flavor": "a100", "resources": {"gpu": 64}}]}],
    "tenant_queues": [{"tenant": "ml", "queue": "team-a"}],
}


class InMemoryWorkloads:
    """The `workloads` table: what admission made sure of for each job, by job id."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, list[tuple[str, str]], Applied, str, Owner]] = {}
        self.pending: list[WorkloadDue] = []
        """What `due` answers, oldest change first, less those recorded as they want since."""

    async def record(
        self,
        job_id: str,
        namespace: str,
        objects: Sequence[tuple[str, str]],
        applied: Applied,
        at: datetime,
        note: str = "",
        owner: Owner = Owner.TESSERA,
    ) -> None:
        self.rows[job_id] = (namespace, list(objects), applied, note, owner)

    async def user_owned(self, kind: str | None = None) -> list[tuple[str, str, str]]:
        return [
            (job_id, namespace, objects[0][1])
            for job_id, (namespace, objects, applied, _, owner) in self.rows.items()
            if owner is Owner.USER and applied is not Applied.DELETED and objects
            if kind in (None, objects[0][0])
        ]

    async def of_job(self, job_id: str) -> tuple[str, list[tuple[str, str]], Applied, str] | None:
        row = self.rows.get(job_id)
        return None if row is None else (row[0], list(row[1]), row[2], row[3])

    async def conditions_due(self, limit: int = 100) -> list[ConditionsDue]:
        return []

    async def mark_reported(self, job_id: str, updated_at: datetime) -> None:
        return None

    async def forget(self, job_id: str) -> None:
        self.rows.pop(job_id, None)

    async def due(self, limit: int = 100) -> list[WorkloadDue]:
        return [
            item
            for item in self.pending
            if item.job_id not in self.rows or self.rows[item.job_id][2] is not item.want
        ][:limit]


class UnitOfWork(FakeAdmissionUnitOfWork):
    def __init__(self) -> None:
        super().__init__()
        self.fake_workloads = InMemoryWorkloads()

    def open_repositories(self, session: object) -> None:
        super().open_repositories(session)
        self.workloads = self.fake_workloads

    def applied(self, job_id: str) -> Applied:
        return self.fake_workloads.rows[job_id][2]


class Cluster:
    """The objects of one Kubernetes cluster, by kind; every replica's view of it lists them anew."""

    def __init__(self) -> None:
        self.objects: dict[str, list[dict[str, Any]]] = {"Job": [], "Pod": [], "LwsPod": [], "Lws": []}
        self.events: list[tuple[str, str, str]] = []


class View:
    """One replica's client of ``cluster``. With ``held``, its next listing of ``kind`` is taken,
    then answered only once ``held`` is set (the replica lists, then goes on with its round later)."""

    def __init__(self, cluster: Cluster, kind: str = "", held: asyncio.Event | None = None) -> None:
        self.cluster, self.held_kind, self.held = cluster, kind, held
        self.listed = asyncio.Event()

    async def _list(self, kind: str) -> list[dict[str, Any]]:
        items = copy.deepcopy(self.cluster.objects[kind])
        if kind == self.held_kind and self.held is not None:
            self.listed.set()
            await self.held.wait()
            self.held = None
        return items

    async def labelled_jobs(self) -> list[dict[str, Any]]:
        return await self._list("Job")

    async def labelled_jobsets(self) -> list[dict[str, Any]]:
        return []

    async def labelled_pods(self) -> list[dict[str, Any]]:
        return await self._list("Pod")

    async def lws_pods(self) -> list[dict[str, Any]]:
        return await self._list("LwsPod")

    async def leaderworkersets(self) -> list[dict[str, Any]]:
        return await self._list("Lws")

    async def priority_classes(self) -> list[dict[str, Any]]:
        return []

    async def label_pods(
        self, namespace: str, labels: Mapping[str, Mapping[str, str]], release: bool
    ) -> list[str]:
        return []

    async def delete(self, namespace: str, objects: Sequence[tuple[str, str]]) -> None:
        return None

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
        self.cluster.events.append((job, reason, message))


def container() -> dict[str, Any]:
    return {"name": "m", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}


def a_job(name: str, job_id: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "labels": {"tessera.io/queue": "team-a", "tessera.io/job-id": job_id},
        },
        "spec": {"parallelism": 1, "template": {"spec": {"containers": [container()]}}},
    }


def a_pod(name: str, job_id: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "labels": {"tessera.io/queue": "team-a", "tessera.io/job-id": job_id},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "serve-7f9c"}],
        },
        "spec": {
            "schedulerName": "tessera",
            "schedulingGates": [{"name": "tessera.io/admission"}],
            "containers": [container()],
        },
        "status": {"phase": "Pending"},
    }


def a_lws() -> dict[str, Any]:
    template = {"spec": {"containers": [container()]}}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {
            "name": "llm",
            "namespace": "ml",
            "uid": "u-1",
            "labels": {"tessera.io/queue": "team-a"},
        },
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {"size": 2, "leaderTemplate": template, "workerTemplate": template},
        },
    }


def a_lws_pod(name: str, worker: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "labels": {
                f"{P}name": "llm",
                f"{P}group-index": "0",
                f"{P}group-key": "key-0",
                f"{P}worker-index": worker,
                "tessera.io/queue": "team-a",
            },
        },
        "spec": {"schedulingGates": [{"name": "tessera.io/admission"}], "containers": [container()]},
        "status": {"phase": "Pending"},
    }


Round = Callable[[Callable[[], UnitOfWork], View], Coroutine[Any, Any, int]]


def user_creates_a_job(cluster: Cluster) -> None:
    cluster.objects["Job"].append(a_job("train", "j-x"))


def user_creates_a_pod(cluster: Cluster) -> None:
    cluster.objects["Pod"].append(a_pod("serve-x", "j-x"))


def user_creates_a_lws(cluster: Cluster) -> None:
    cluster.objects["Lws"].append(a_lws())
    cluster.objects["LwsPod"].extend([a_lws_pod("llm-0", "0"), a_lws_pod("llm-0-1", "1")])


CASES = [
    pytest.param("Job", adopt_native_jobs, user_creates_a_job, id="Job"),
    pytest.param("Pod", adopt_native_pods, user_creates_a_pod, id="Pod"),
    pytest.param("LwsPod", sync_lws_groups, user_creates_a_lws, id="LeaderWorkerSet"),
]


@pytest.mark.parametrize(("listed", "adopt", "create"), CASES)
async def test_a_workload_created_after_one_replica_listed_and_adopted_by_another_is_not_cancelled(
    listed: str, adopt: Round, create: Callable[[Cluster], None]
) -> None:
    uow = UnitOfWork()
    uow.configure(QUEUES)
    cluster = Cluster()
    held = asyncio.Event()
    first = View(cluster, listed, held)
    late = asyncio.create_task(adopt(lambda: uow, first))  # replica A lists: nothing yet
    await first.listed.wait()
    create(cluster)  # the user applies a workload
    assert await adopt(lambda: uow, View(cluster)) == 1, "replica B lists it and adopts it"
    (job_id,) = uow.fake_jobs.stored
    assert uow.job(job_id).state is JobState.QUEUED
    held.set()
    await late  # replica A ends its round on its listing, taken before the workload was made
    assert uow.job(job_id).state is JobState.QUEUED, "it exists: its job is not cancelled"
    assert uow.applied(job_id) is Applied.SUSPENDED
    assert not [e for e in cluster.events if "deleted" in e[2] or "gone" in e[2]]

    cluster.objects = {kind: [] for kind in cluster.objects}  # the user deletes it
    assert await adopt(lambda: uow, View(cluster)) == 1
    assert uow.job(job_id).state is JobState.CANCELLED, "deleted: its job is cancelled"
    assert uow.applied(job_id) is Applied.DELETED


class Refusing:
    """A cluster that refuses every change in namespace ``locked`` and makes the others."""

    def __init__(self, locked: str) -> None:
        self.locked = locked
        self.tried: list[str] = []

    async def set_suspended(
        self, namespace: str, jobs: Sequence[str], suspended: bool, placements: Any = None
    ) -> list[str]:
        self.tried.extend(jobs)
        if namespace == self.locked:
            raise WorkloadError(f"namespaces {namespace!r} not found")
        return list(jobs)

    async def event(self, *args: Any, **kwargs: Any) -> None:
        return None


def admitted(job_id: str, namespace: str) -> WorkloadDue:
    return WorkloadDue(
        job_id, JobState.ADMITTED, None, namespace, (("Job", job_id),), Applied.SUSPENDED, Applied.RUNNING
    )


async def test_jobs_the_cluster_keeps_refusing_do_not_take_every_round_from_the_others() -> None:
    uow = UnitOfWork()
    stuck = [admitted(f"stuck-{i}", "gone") for i in range(150)]  # their namespace was deleted
    uow.fake_workloads.pending = [*stuck, admitted("fresh", "ml")]  # oldest change first
    cluster = Refusing("gone")
    refused: set[str] = set()
    rounds = [await sync_workloads(lambda: uow, cluster, "tessera", 100, refused) for _ in range(3)]  # type: ignore[arg-type]
    assert uow.fake_workloads.rows.get("fresh", ("", [], None))[2] is Applied.RUNNING, rounds
    assert rounds[0] == 0 and sum(rounds) == 1
    assert set(cluster.tried) == {item.job_id for item in uow.fake_workloads.pending}, "each is tried"
    assert refused == {item.job_id for item in stuck}, "the refused are tried again, after the others"


async def test_a_users_own_job_keeps_its_service_account_secrets_and_host_network() -> None:
    """The shared-namespace template rules are for the pods admission makes; a user's own Job runs in
    the user's namespace with the user's rights, so its service account, a Secret-fed env var and
    host networking (multi-node NCCL) are the user's business, and the job is queued."""
    uow = UnitOfWork()
    uow.configure(QUEUES)
    cluster = Cluster()
    job = a_job("train", "j-x")
    pod = job["spec"]["template"]["spec"]
    pod["serviceAccountName"] = "trainer"
    pod["hostNetwork"] = True
    pod["imagePullSecrets"] = [{"name": "registry"}]
    secret = {"secretKeyRef": {"name": "hf", "key": "token"}}
    pod["containers"][0]["env"] = [{"name": "HF_TOKEN", "valueFrom": secret}]
    cluster.objects["Job"].append(job)
    assert await adopt_native_jobs(lambda: uow, View(cluster)) == 1
    (job_id,) = uow.fake_jobs.stored
    assert uow.job(job_id).state is JobState.QUEUED, uow.job(job_id).errors


class Killed(Exception):
    """The process dies here."""


class LwsView(View):
    """The LeaderWorkerSet's pods as the API server keeps them: released by their labels, deleted
    (or the process killed first, with ``kill_at_delete``); and its Events by name, as the API server
    keeps them (creating one of a name that exists changes nothing; one with no name gets a random
    one)."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster)
        self.named: dict[str, tuple[str, str]] = {}
        self.kill_at_delete = False

    async def label_pods(
        self, namespace: str, labels: Mapping[str, Mapping[str, str]], release: bool
    ) -> list[str]:
        released = []
        for pod in self.cluster.objects["LwsPod"]:
            name = pod["metadata"]["name"]
            if name in labels and pod["spec"]["schedulingGates"]:
                pod["metadata"]["labels"].update(labels[name])
                pod["spec"]["schedulingGates"] = []
                released.append(name)
        return released

    async def delete(self, namespace: str, objects: Sequence[tuple[str, str]]) -> None:
        if self.kill_at_delete:
            raise Killed
        gone = {name for _, name in objects}
        self.cluster.objects["LwsPod"] = [
            p for p in self.cluster.objects["LwsPod"] if p["metadata"]["name"] not in gone
        ]

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
        self.named.setdefault(name or f"{job}.{uuid.uuid4().hex[:16]}", (reason, message))


async def test_a_lws_groups_preemption_is_told_once_though_the_round_died_after_telling_it() -> None:
    """A round tells the Preempted Event, then deletes the group's pods; killed between the two, the
    next round finds the group released still and tells it again: under the same name, so one Event
    (before, each told one of a random name: two). A worker made again, under the name of the one
    before, is another release each time and gets an Event of its own."""
    uow = UnitOfWork()
    uow.configure(QUEUES)
    cluster = Cluster()
    user_creates_a_lws(cluster)
    view = LwsView(cluster)
    assert await sync_lws_groups(lambda: uow, view) == 1
    (job_id,) = uow.fake_jobs.stored
    uow.job(job_id).state = JobState.ADMITTED
    assert await sync_lws_groups(lambda: uow, view) == 1, "released"
    for again in ("again", "and-again"):  # its worker deleted and made again, gated
        remade = a_lws_pod("llm-0-1", "1")
        remade["metadata"]["uid"] = f"uid-llm-0-1-{again}"
        cluster.objects["LwsPod"] = [cluster.objects["LwsPod"][0], remade]
        assert await sync_lws_groups(lambda: uow, view) == 1, "the new worker released"

    uow.job(job_id).state = JobState.PREEMPTED
    view.kill_at_delete = True
    with pytest.raises(Killed):
        await sync_lws_groups(lambda: uow, view)
    view.kill_at_delete = False
    assert await sync_lws_groups(lambda: uow, view) == 1, "the next round tells it, then deletes"
    assert cluster.objects["LwsPod"] == []
    told = [reason for reason, _ in view.named.values()]
    assert told == ["Queued", "Admitted", "Admitted", "Admitted", "Preempted"]


async def test_a_lws_groups_wait_reasons_given_again_later_are_told_again() -> None:
    """A group waits for reason A, then B, then A, then B again: four Events (before, the second B had
    the name of the first, each the change from A, and was taken as told already, so `kubectl
    describe` showed the first B's time). The same change told again is one Event."""
    uow = UnitOfWork()
    uow.configure(QUEUES)
    cluster = Cluster()
    user_creates_a_lws(cluster)
    view = LwsView(cluster)
    assert await sync_lws_groups(lambda: uow, view) == 1
    (job_id,) = uow.fake_jobs.stored
    job = uow.job(job_id)
    reasons = ("Inadmissible", "QuotaExhausted", "Inadmissible", "QuotaExhausted")
    for minute, reason in enumerate(reasons):
        job.wait(reason, f"why {reason}", datetime(2026, 11, 24, 9, minute, tzinfo=UTC))
        await sync_lws_groups(lambda: uow, view)
        await sync_lws_groups(lambda: uow, view)  # nothing new: nothing told
    told = [reason for reason, _ in view.named.values()]
    assert told == ["Queued", *reasons]
