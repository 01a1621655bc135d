"""Two schedulers on one devcluster elect a leader on a coordination.k8s.io/v1 Lease.

Only the leader decides and binds; the follower keeps its consumers and its watches. When the
leader stops, the follower takes over at its next retry; when it vanishes without a word, once the
lease has run out. No pod is ever bound twice.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tessera.cluster.domain.allocation import DeviceAssignment
from tessera.cluster.domain.requirements import PodRef
from tessera.cluster.kube.adapter import KubernetesCluster
from tessera.cluster.leader import LeaderElector
from tessera.contracts import subjects
from tessera.contracts.events import JobAdmitted
from tessera.contracts.jobs import JobSpec
from tessera.core.db.engine import async_url
from tessera.core.db.migrations import migrate_all
from tessera.core.messaging.envelope import encode
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.core.runner import RunningService
from tessera.devcluster.apiserver import PODS
from tessera.devcluster.apiserver.resources import LEASES
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
LEASE = {"lease_duration_s": 3.0, "renew_deadline_s": 2.0, "retry_period_s": 0.5}
Binds = list[tuple[str, str]]  # (scheduler, pod) of every Binding made


class LoggedCluster(KubernetesCluster):
    def __init__(self, api: Any, name: str, binds: Binds) -> None:
        super().__init__(api)
        self.name = name
        self.binds = binds

    async def bind(self, ref: PodRef, node: str, assignment: DeviceAssignment | None = None) -> None:
        await super().bind(ref, node, assignment)
        self.binds.append((self.name, ref.name))


def gang_job(name: str, pods: int = 2) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": name,
            "tenant": "research",
            "pod_groups": [
                {
                    "name": "worker",
                    "replicas": pods,
                    "cpu": "4",
                    "memory": "8Gi",
                    "gpu": {"count": 2},
                    "template": {"spec": {"containers": [{"name": "main", "image": TRAINING_IMAGE}]}},
                }
            ],
        }
    )


@pytest.fixture
def devcluster() -> Iterator[DevCluster]:
    cluster = DevCluster.from_file(CLUSTER_FILE, speed=20.0, duty_cycle=DutyCycleTrace.synthetic())
    with cluster:
        yield cluster


class World:
    def __init__(self, nats_url: str, db: str, devcluster: DevCluster, kubeconfig: Path) -> None:
        self.nats_url, self.db, self.devcluster, self.kubeconfig = nats_url, db, devcluster, kubeconfig
        self.binds: Binds = []

    def settings(self) -> SchedulerSettings:
        return settings_for(
            SchedulerSettings,
            self.nats_url,
            self.db,
            kubeconfig=self.kubeconfig,
            poll_s=0.2,
            leader_election=LEASE,
            gang={"backoff_initial_s": 0.2, "backoff_max_s": 1.0, "max_parked_s": 5.0},
        )

    def scheduler(self, name: str) -> Any:
        settings = self.settings()
        factory = lambda api: LoggedCluster(api, name, self.binds)  # noqa: E731
        return running(bootstrap.build(settings, cluster_factory=factory), settings)

    def bound(self, prefix: str) -> list[str]:
        items, _ = self.devcluster.store.list(PODS, "default")
        return [
            str(pod["spec"]["nodeName"])
            for pod in items
            if pod["metadata"]["name"].startswith(prefix) and pod["spec"].get("nodeName")
        ]

    def holder(self) -> str | None:
        lease = self.devcluster.store.get(LEASES, "default", "tessera-scheduler")
        return (lease.get("spec") or {}).get("holderIdentity") or None

    async def admit(self, job_id: str, spec: JobSpec) -> None:
        nc = await nats.connect(self.nats_url)
        try:
            js = nc.jetstream()
            await ensure_stream(js, "admission", StreamLimits(120.0, 3600.0, 1024**3, 1))
            subject, headers, body = encode(
                JobAdmitted(job_id=job_id, spec=spec, submitted_at=datetime.now(UTC)), "tessera/admission"
            )
            await js.publish(subject, body, headers=headers)
        finally:
            await nc.close()
        await run_workloads(self.kubeconfig, job_id, spec)  # admission's part on the cluster

    async def placed(self, job_id: str) -> list[Any]:
        nc = await nats.connect(self.nats_url)
        try:
            events = await read_stream(nc.jetstream(), subjects.GANG_PLACED, idle_s=0.2)
        finally:
            await nc.close()
        return [e for e in (envelope.parse() for envelope in events) if e.job_id == job_id]

    async def placements(self) -> int:
        engine = create_async_engine(async_url(self.db))
        try:
            async with engine.connect() as conn:
                return int(
                    (await conn.execute(text("SELECT count(*) FROM scheduler.placements"))).scalar_one()
                )
        finally:
            await engine.dispose()


@pytest.fixture
async def world(
    nats_url: str, fresh_database: str, devcluster: DevCluster, tmp_path: Path
) -> AsyncIterator[World]:
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate_all, fresh_database)
    yield World(nats_url, fresh_database, devcluster, devcluster.write_kubeconfig(tmp_path / "kubeconfig"))


def elector(service: RunningService[SchedulerDeps]) -> LeaderElector:
    assert service.deps.cluster is not None and service.deps.cluster.leader is not None
    return service.deps.cluster.leader


async def _is(value: Any) -> Any:
    return value


def prefix(name: str, job_id: str) -> str:
    return f"{name}-{job_id.replace('-', '')[:8]}-"


class Instances:
    """Schedulers started and stopped one by one; whatever still runs stops at the end."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.open: dict[str, Any] = {}

    async def start(self, name: str) -> RunningService[SchedulerDeps]:
        context = self.world.scheduler(name)
        service: RunningService[SchedulerDeps] = await context.__aenter__()
        self.open[name] = context
        return service

    async def stop(self, name: str) -> None:
        await self.open.pop(name).__aexit__(None, None, None)

    async def close(self) -> None:
        for name in list(self.open):
            await self.stop(name)


async def test_one_scheduler_leads_and_the_other_takes_over_when_it_stops_or_vanishes(world: World) -> None:
    jobs = {name: str(uuid.uuid4()) for name in ("alpha", "beta", "gamma")}
    schedulers = Instances(world)
    try:
        a = await schedulers.start("a")
        await eventually(lambda: _is(elector(a).leading), what="the first scheduler to lead")
        b = await schedulers.start("b")
        await eventually(lambda: _is(elector(b).leader == elector(a).identity), what="b to see a lead")
        assert world.holder() == elector(a).identity

        # Only the leader decides: b consumes, records, watches, and never runs a cycle.
        await world.admit(jobs["alpha"], gang_job("alpha"))
        await eventually(
            lambda: _is(len(world.bound(prefix("alpha", jobs["alpha"]))) == 2), what="alpha bound"
        )
        await asyncio.sleep(1.0)
        assert b.deps.engine.cycles == 0 and not elector(b).leading
        assert {who for who, _ in world.binds} == {"a"}

        # The leader stops cleanly: it releases the lease and b takes over. b's clock stands still
        # meanwhile, so a lease it saw held never runs out for it: it can lead only by taking the
        # released one (shown without timing the handover, which a loaded machine stretches).
        follower = elector(b)
        frozen = follower._clock()
        follower._clock = lambda: frozen
        await schedulers.stop("a")
        await eventually(lambda: _is(follower.leading), what="b to take the released lease")
        follower._clock = time.monotonic
        await world.admit(jobs["beta"], gang_job("beta"))
        await eventually(lambda: _is(len(world.bound(prefix("beta", jobs["beta"]))) == 2), what="beta bound")
        c = await schedulers.start("c")
        await eventually(lambda: _is(elector(c).leader == elector(b).identity), what="c to see b lead")

        # The leader vanishes without a word (no release, no more renewals): the follower waits for
        # the lease to run out, then leads; the job admitted meanwhile is bound once, by it.
        elector(b).release = _no_release  # type: ignore[method-assign]
        vanished_at = time.monotonic()
        await schedulers.stop("b")
        await world.admit(jobs["gamma"], gang_job("gamma"))
        await eventually(lambda: _is(elector(c).leading), what="c to lead", timeout=15)
        took = time.monotonic() - vanished_at
        duration, retry = LEASE["lease_duration_s"], LEASE["retry_period_s"]
        # never before the lease ran out: it last saw the lease renewed up to a retry (and its jitter)
        # before the leader vanished (a lower bound only; how much later depends on the machine)
        assert duration - 2 * retry <= took, f"took over after {took:.1f}s"
        await eventually(
            lambda: _is(len(world.bound(prefix("gamma", jobs["gamma"]))) == 2), what="gamma bound", timeout=20
        )
        assert world.holder() == elector(c).identity

        async def every_gang_announced() -> bool:  # before c stops: its relay publishes what it decided
            return all([len(await world.placed(job_id)) >= 1 for job_id in jobs.values()])

        await eventually(every_gang_announced, what="gang_placed of every job published", timeout=20)
    finally:
        await schedulers.close()

    assert [who for who, _ in world.binds] == ["a", "a", "b", "b", "c", "c"]
    pods = [pod for _, pod in world.binds]
    assert len(pods) == len(set(pods)), f"a pod was bound twice: {world.binds}"
    for job_id in jobs.values():
        assert len(await world.placed(job_id)) == 1, "each gang placed once"
    assert await world.placements() == 6


async def _no_release() -> None:
    return None
