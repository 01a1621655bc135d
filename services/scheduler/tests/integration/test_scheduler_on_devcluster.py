"""The scheduler service on a 4x8 A100 devcluster, with real Postgres and NATS.

Two gangs of 4 pods x 8 GPUs compete for the 32 GPUs: one is bound whole, the other waits holding
nothing and runs when the first finishes. A bind failing halfway is rolled back. A restart loses
no placement and binds nothing twice.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tessera.cluster.builders import PodManifest, pod_group_manifest
from tessera.cluster.conventions.names import GPU_ASSIGNMENT_ANNOTATION
from tessera.cluster.domain.allocation import DeviceAssignment
from tessera.cluster.domain.requirements import PodRef
from tessera.cluster.kube.adapter import KubernetesCluster
from tessera.cluster.port import ClusterError
from tessera.contracts import subjects
from tessera.contracts.events import JobAdmitted
from tessera.contracts.jobs import JobSpec
from tessera.core.db.engine import async_url
from tessera.core.db.migrations import migrate_all
from tessera.core.messaging.envelope import encode
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.core.runner import RunningService
from tessera.devcluster.apiserver import PODGROUPS, PODS
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.nvml import DutyCycleTrace
from tessera.scheduler import bootstrap
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.service_layer.dependencies import SchedulerDeps
from tessera.testing.builders import TRAINING_IMAGE
from tessera.testing.services import eventually, read_stream, reset_jetstream, running, settings_for

from .workloads import run_workloads

pytestmark = pytest.mark.integration

CLUSTER_FILE = Path(__file__).resolve().parents[4] / "examples" / "clusters" / "dev-4x8.yaml"
SPEED = 20.0  # simulated seconds per wall-clock second


def gang_job(name: str, duration_s: int | None) -> JobSpec:
    """4 pods x 8 GPUs; the devcluster's kubelet ends them after ``duration_s`` (never when None)."""
    return JobSpec.model_validate(
        {
            "name": name,
            "tenant": "research",
            "pod_groups": [
                {
                    "name": "worker",
                    "replicas": 4,
                    "cpu": "8",
                    "memory": "32Gi",
                    "gpu": {"count": 8},
                    "template": {"spec": {"containers": [{"name": "main", "image": TRAINING_IMAGE}]}},
                }
            ],
            "estimated_duration_s": duration_s,
        }
    )


@dataclass
class World:
    nats_url: str
    db: str
    devcluster: DevCluster
    kubeconfig: Path

    def settings(self) -> SchedulerSettings:
        return settings_for(
            SchedulerSettings,
            self.nats_url,
            self.db,
            kubeconfig=self.kubeconfig,
            poll_s=0.2,
            gang={"backoff_initial_s": 0.2, "backoff_max_s": 1.0, "max_parked_s": 5.0},
        )

    def pods(self, job_prefix: str) -> list[dict[str, Any]]:
        items, _ = self.devcluster.store.list(PODS, "default")
        return sorted(
            (pod for pod in items if pod["metadata"]["name"].startswith(job_prefix)),
            key=lambda pod: str(pod["metadata"]["name"]),
        )

    async def admit(self, job_id: str, spec: JobSpec) -> None:
        nc = await nats.connect(self.nats_url)
        try:
            js = nc.jetstream()
            await ensure_stream(js, "admission", StreamLimits(120.0, 3600.0, 1024**3, 1))
            event = JobAdmitted(job_id=job_id, spec=spec, submitted_at=datetime.now(UTC))
            subject, headers, body = encode(event, "tessera/admission")
            await js.publish(subject, body, headers=headers)
        finally:
            await nc.close()
        await run_workloads(self.kubeconfig, job_id, spec)  # admission's part on the cluster

    async def events(self, subject: str) -> list[Any]:
        nc = await nats.connect(self.nats_url)
        try:
            return [envelope.parse() for envelope in await read_stream(nc.jetstream(), subject, idle_s=0.2)]
        finally:
            await nc.close()

    async def rows(self, query: str) -> list[tuple[Any, ...]]:
        engine = create_async_engine(async_url(self.db))
        try:
            async with engine.connect() as conn:
                return [tuple(row) for row in (await conn.execute(text(query))).all()]
        finally:
            await engine.dispose()


@pytest.fixture
def devcluster() -> Iterator[DevCluster]:
    cluster = DevCluster.from_file(CLUSTER_FILE, speed=SPEED, duty_cycle=DutyCycleTrace.synthetic())
    with cluster:
        yield cluster


@pytest.fixture
async def world(
    nats_url: str, fresh_database: str, devcluster: DevCluster, tmp_path: Path
) -> AsyncIterator[World]:
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate_all, fresh_database)
    kubeconfig = devcluster.write_kubeconfig(tmp_path / "kubeconfig")
    yield World(nats_url, fresh_database, devcluster, kubeconfig)


def bound(pods: list[dict[str, Any]]) -> list[str]:
    return [str(pod["spec"]["nodeName"]) for pod in pods if pod["spec"].get("nodeName")]


def job_prefix(name: str, job_id: str) -> str:
    return f"{name}-{job_id.replace('-', '')[:8]}-"


async def test_two_competing_gangs_one_runs_then_the_other(world: World) -> None:
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    settings = world.settings()
    async with running(bootstrap.build(settings), settings):
        await world.admit(first, gang_job("alpha", duration_s=100))
        await eventually(
            lambda: _async(len(bound(world.pods(job_prefix("alpha", first)))) == 4),
            what="the first gang bound",
            timeout=20,
        )
        await world.admit(second, gang_job("beta", duration_s=20))
        unschedulable = await eventually(
            lambda: _matching(world, subjects.GANG_UNSCHEDULABLE, second), what="beta reported unschedulable"
        )
        alpha = world.pods(job_prefix("alpha", first))
        beta = world.pods(job_prefix("beta", second))
        assert len(beta) == 4 and bound(beta) == [], "the waiting gang holds no node"
        assert sorted(bound(alpha)) == [f"gpu-node-{i}" for i in range(4)]
        for pod in alpha:
            assignment = json.loads(pod["metadata"]["annotations"][GPU_ASSIGNMENT_ANNOTATION])
            assert assignment["node"] == pod["spec"]["nodeName"] and len(assignment["gpus"]) == 8
        # The cluster-wide pre-check rejects it on every node at once: 32 GPUs wanted, none free.
        assert unschedulable[0].rejected_nodes == {"gang needs more GPUs than are free (32 > 0)": 4}
        held = await world.rows(f"SELECT count(*) FROM scheduler.placements WHERE job_id = '{second}'")
        assert held == [(0,)]

        finished = await eventually(
            lambda: _matching(world, subjects.GANG_FINISHED, first), what="alpha finished", timeout=30
        )
        assert finished[0].succeeded is True
        await eventually(
            lambda: _async(len(bound(world.pods(job_prefix("beta", second)))) == 4),
            what="the second gang bound after the first finished",
            timeout=20,
        )
        placed = await world.events(subjects.GANG_PLACED)
        assert [event.job_id for event in placed] == [first, second]
        demand = [
            (e.pending_gangs, [(d.gpus, d.pods) for d in e.demand])
            for e in await world.events(subjects.DEMAND_CHANGED)
        ]
        assert demand == [(1, [(8, 4)]), (0, [])], "beta's unmet demand, then none"


async def _async(value: Any) -> Any:
    return value


async def _matching(world: World, subject: str, job_id: str) -> list[Any]:
    return [event for event in await world.events(subject) if event.job_id == job_id]


async def after_more_cycles(service: RunningService[SchedulerDeps], cycles: int = 2) -> None:
    """Return once the scheduling loop has run `cycles` whole cycles that began after this call.

    `engine.cycles` counts cycles as they begin and the loop runs one at a time, so once it reaches
    its value now + `cycles` + 1, every one of the `cycles` cycles after now has finished."""
    engine = service.deps.engine
    target = engine.cycles + cycles + 1
    await eventually(
        lambda: _async(engine.cycles >= target), what=f"{cycles} more scheduling cycles", timeout=20
    )


class ScriptedCluster(KubernetesCluster):
    """The Kubernetes adapter with a log of binds and evictions, failing chosen binds (1-based).

    ``refuse``: the API refuses the bind (a ClusterError). ``crash``: the scheduler itself fails
    mid-bind (the cycle aborts and its transaction rolls back, as if the process died there).
    """

    def __init__(self, api: Any, script: dict[int, str], log: list[tuple[str, str]]) -> None:
        super().__init__(api)
        self.script = script
        self.log = log

    async def bind(self, ref: PodRef, node: str, assignment: DeviceAssignment | None = None) -> None:
        call = sum(1 for verb, _ in self.log if verb.startswith("bind")) + 1
        action = self.script.get(call)
        if action == "refuse":
            self.log.append(("bind-refused", ref.name))
            raise ClusterError(f"injected: the API refused binding {ref}")
        if action == "crash":
            self.log.append(("bind-crashed", ref.name))
            raise RuntimeError(f"injected: the scheduler died binding {ref}")
        await super().bind(ref, node, assignment)
        self.log.append(("bind", ref.name))

    async def evict(self, ref: PodRef, grace_period_seconds: int | None = None) -> None:
        await super().evict(ref, grace_period_seconds)
        self.log.append(("evict", ref.name))


def scripted(script: dict[int, str], log: list[tuple[str, str]]) -> Any:
    return lambda api: ScriptedCluster(api, script, log)


async def test_a_bind_failing_halfway_evicts_the_bound_pods_and_holds_nothing(world: World) -> None:
    job = str(uuid.uuid4())
    log: list[tuple[str, str]] = []
    settings = world.settings().model_copy(
        update={"gang": world.settings().gang.model_copy(update={"backoff_initial_s": 3.0})}
    )
    async with running(bootstrap.build(settings, cluster_factory=scripted({3: "refuse"}, log)), settings):
        await world.admit(job, gang_job("alpha", duration_s=600))
        evicted = await eventually(lambda: _matching(world, subjects.PODS_EVICTED, job), what="pods evicted")
        # Inside the backoff: nothing of the gang is bound or recorded, the gang waits to retry.
        first_two = [name for verb, name in log if verb == "bind"]
        assert len(first_two) == 2
        assert evicted[0].pods == sorted(first_two) and evicted[0].reason == "bind_failed"
        assert sorted(name for verb, name in log if verb == "evict") == sorted(first_two)
        assert bound(world.pods(job_prefix("alpha", job))) == []
        assert await world.rows("SELECT count(*) FROM scheduler.placements") == [(0,)]
        assert await world.rows(
            f"SELECT reason_code, attempts FROM scheduler.pending_gangs WHERE job_id = '{job}'"
        ) == [("bind_failed", 1)]
        # After the backoff the evicted pods are recreated and the whole gang is bound.
        await eventually(
            lambda: _async(len(bound(world.pods(job_prefix("alpha", job)))) == 4),
            what="alpha bound",
            timeout=20,
        )
        placed = await eventually(lambda: _matching(world, subjects.GANG_PLACED, job), what="gang_placed")
        assert len(placed) == 1 and len(placed[0].placements) == 4
        assert await world.rows("SELECT count(*) FROM scheduler.placements") == [(4,)]


async def test_a_restart_loses_no_placement_and_binds_nothing_twice(world: World) -> None:
    alpha, beta, gamma = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    log: list[tuple[str, str]] = []
    settings = world.settings()
    async with running(bootstrap.build(settings, cluster_factory=scripted({}, log)), settings):
        await world.admit(alpha, gang_job("alpha", duration_s=None))
        await eventually(
            lambda: _async(len(bound(world.pods(job_prefix("alpha", alpha)))) == 4), what="alpha bound"
        )
        await world.admit(beta, gang_job("beta", duration_s=20))
        await eventually(lambda: _matching(world, subjects.GANG_UNSCHEDULABLE, beta), what="beta waiting")
    assert len(log) == 4
    # A new instance: the placement is rebuilt from the database and the cluster, not bound again.
    log_after: list[tuple[str, str]] = []
    async with running(
        bootstrap.build(settings, cluster_factory=scripted({}, log_after)), settings
    ) as restarted:
        # The first cycle rebuilds from the database and the cluster; the next one schedules again.
        await after_more_cycles(restarted, 2)
        assert log_after == [], "nothing is bound again after a restart"
        assert await world.rows(f"SELECT count(*) FROM scheduler.placements WHERE job_id = '{alpha}'") == [
            (4,)
        ]
        for pod in world.pods(job_prefix("alpha", alpha)):  # alpha's pods go away
            world.devcluster.store.delete(PODS, "default", pod["metadata"]["name"])
        finished = await eventually(
            lambda: _matching(world, subjects.GANG_FINISHED, alpha), what="alpha finished"
        )
        assert finished[0].succeeded is False and set(finished[0].pods.values()) == {"Deleted"}
        await eventually(
            lambda: _async(len(bound(world.pods(job_prefix("beta", beta)))) == 4), what="beta bound"
        )
        await eventually(
            lambda: _matching(world, subjects.GANG_FINISHED, beta), what="beta finished", timeout=30
        )
    bound_twice = [
        name
        for name in {n for _, n in log + log_after}
        if [v for v, n in log + log_after if n == name].count("bind") > 1
    ]
    assert bound_twice == []
    assert [verb for verb, _ in log_after] == ["bind"] * 4
    # Dying halfway through binding gamma (after 2 of 4): the rebuilt state finds gamma bound below
    # its quorum, evicts the 2 pods and binds the whole gang again.
    crash_log: list[tuple[str, str]] = []
    async with running(
        bootstrap.build(settings, cluster_factory=scripted({3: "crash"}, crash_log)), settings
    ):
        await world.admit(gamma, gang_job("gamma", duration_s=600))
        evicted = await eventually(
            lambda: _matching(world, subjects.PODS_EVICTED, gamma), what="gamma evicted"
        )
        assert evicted[0].reason == "partial_after_restart"
        assert sorted(evicted[0].pods) == sorted([name for verb, name in crash_log if verb == "bind"][:2])
        await eventually(
            lambda: _async(len(bound(world.pods(job_prefix("gamma", gamma)))) == 4), what="gamma bound"
        )
        # Pods are bound inside the cycle and its placements commit at its end, with gang_placed.
        await eventually(lambda: _matching(world, subjects.GANG_PLACED, gamma), what="gamma placed")
        assert await world.rows(f"SELECT count(*) FROM scheduler.placements WHERE job_id = '{gamma}'") == [
            (4,)
        ]


def member_pod(name: str, group: str, gpus: int) -> dict[str, Any]:
    return (
        PodManifest(name)
        .scheduler()
        .group(group)
        .requests(cpu="4", memory="16Gi")
        .gpus(gpus)
        .annotate("tessera.io/sim-duration", "20")
        .obj()
    )


async def test_pods_already_on_the_cluster_are_scheduled_as_their_pod_group(world: World) -> None:
    settings = world.settings()
    store = world.devcluster.store
    store.create(PODGROUPS, "default", pod_group_manifest("infer", min_member=3))
    for i in range(2):
        store.create(PODS, "default", member_pod(f"infer-{i}", "infer", gpus=4))
    async with running(bootstrap.build(settings), settings) as scheduler:
        query = "SELECT job_id, source FROM scheduler.pending_gangs"
        await eventually(lambda: world.rows(query), what="the pod group queued")
        assert await world.rows(query) == [("default/infer", "podgroup")]
        await after_more_cycles(scheduler, 3)  # two members wait in Permit for the third
        assert bound(world.pods("infer-")) == [], "two of three members are not a quorum"
        store.create(PODS, "default", member_pod("infer-2", "infer", gpus=4))
        placed = await eventually(
            lambda: _matching(world, subjects.GANG_PLACED, "default/infer"), what="infer placed"
        )
        assert sorted(p.pod for p in placed[0].placements) == ["infer-0", "infer-1", "infer-2"]
        assert len(bound(world.pods("infer-"))) == 3
        for pod in world.pods("infer-"):
            assert GPU_ASSIGNMENT_ANNOTATION in pod["metadata"]["annotations"]
        finished = await eventually(
            lambda: _matching(world, subjects.GANG_FINISHED, "default/infer"),
            what="infer finished",
            timeout=30,
        )
        assert finished[0].pods == {f"infer-{i}": "Succeeded" for i in range(3)}
        # A lone pod for this scheduler is a gang of one.
        solo = member_pod("solo", "unused", gpus=1)
        del solo["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"]
        store.create(PODS, "default", solo)
        placed = await eventually(
            lambda: _matching(world, subjects.GANG_PLACED, "default/solo"), what="solo placed"
        )
        assert [p.pod for p in placed[0].placements] == ["solo"]
        assert len(bound(world.pods("solo"))) == 1
