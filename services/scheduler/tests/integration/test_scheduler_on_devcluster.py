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

from tessera.cluster.conventions.names import GPU_ASSIGNMENT_ANNOTATION
from tessera.cluster.domain.allocation import DeviceAssignment
from tessera.cluster.domain.requirements import PodRef
from tessera.cluster.kube.adapter import KubernetesCluster
from tessera.contracts import subjects
from tessera.contracts.events import JobAdmitted
from tessera.contracts.jobs import JobSpec
from tessera.core.db.engine import async_url
from tessera.core.db.migrations import migrate_all
from tessera.core.messaging.envelope import encode
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.devcluster.apiserver import PODS
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.nvml import DutyCycleTrace
from tessera.scheduler import bootstrap
from tessera.scheduler.config import SchedulerSettings
from tessera.testing.services import eventually, read_stream, reset_jetstream, running, settings_for

pytestmark = pytest.mark.integration

CLUSTER_FILE = Path(__file__).resolve().parents[4] / "examples" / "clusters" / "dev-4x8.yaml"
SPEED = 20.0  # simulated seconds per wall-clock second


def gang_job(name: str, duration_s: int) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": name,
            "tenant": "research",
            "pod_groups": [
                {"name": "worker", "replicas": 4, "cpu": "8", "memory": "32Gi", "gpu": {"count": 8}}
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
        await world.admit(first, gang_job("alpha", duration_s=40))
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


async def _async(value: Any) -> Any:
    return value


async def _matching(world: World, subject: str, job_id: str) -> list[Any]:
    return [event for event in await world.events(subject) if event.job_id == job_id]


class FailingBinds(KubernetesCluster):
    """The Kubernetes adapter, refusing the Nth bind (1-based)."""

    fail_on = 3
    calls = 0

    async def bind(self, ref: PodRef, node: str, assignment: DeviceAssignment | None = None) -> None:
        type(self).calls += 1
        if type(self).calls == self.fail_on:
            from tessera.cluster.port import ClusterError

            raise ClusterError(f"injected failure binding {ref}")
        await super().bind(ref, node, assignment)
