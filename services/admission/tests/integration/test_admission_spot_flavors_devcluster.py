"""Spot flavors on the devcluster, end to end through admission, the scheduler and telemetry: a queue
with an on-demand and a spot flavor of the same GPU (told apart by `karpenter.sh/capacity-type`, as
Karpenter labels nodes) admits a preemptible job in the spot flavor although the queue lists it
second, and a job that may not be preempted in the on-demand one; admission writes each flavor's node
labels into the Job's pod template as it unsuspends it, the scheduler binds the pods on those nodes,
and telemetry's usage rollup prices each job's GPU-hours at the spot and the on-demand price."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tessera.admission import bootstrap as admission
from tessera.admission.config import AdmissionSettings
from tessera.admission.domain.documents import QueueingDocument
from tessera.admission.service_layer.configuration import change_config
from tessera.admission.service_layer.handlers import submit_job
from tessera.cluster.cluster_file import load_cluster
from tessera.cluster.kube import api_client
from tessera.core.db.engine import async_url
from tessera.core.db.migrations import migrate_all
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.devcluster.sim.nvml import DutyCycleTrace
from tessera.scheduler import bootstrap as scheduler
from tessera.scheduler.config import SchedulerSettings
from tessera.telemetry import bootstrap as telemetry
from tessera.telemetry.config import TelemetrySettings
from tessera.testing.builders import TRAINING_IMAGE
from tessera.testing.services import eventually, reset_jetstream, running, settings_for

pytestmark = pytest.mark.integration

CAPACITY = "karpenter.sh/capacity-type"
CLUSTER = f"""
nodes:
  - name: spot-0
    cpu: "64"
    memory: 512Gi
    labels: {{{CAPACITY}: spot}}
    gpus: {{count: 4, model: A100-80GB}}
  - name: ondemand-0
    cpu: "64"
    memory: 512Gi
    labels: {{{CAPACITY}: on-demand}}
    gpus: {{count: 4, model: A100-80GB}}
"""
ON_DEMAND_PRICE, SPOT_PRICE = 4.0, 1.5
QUEUES = {
    "flavors": [
        {"name": "a100-80gb", "gpu_model": "A100-80GB", "node_labels": {CAPACITY: "on-demand"}},
        {
            "name": "a100-80gb-spot",
            "gpu_model": "A100-80GB",
            "capacity_type": "spot",
            "node_labels": {CAPACITY: "spot"},
        },
    ],
    "queues": [
        {
            "name": "team-a",
            "quotas": [  # on-demand listed first: the preemptible job still goes to spot
                {"flavor": "a100-80gb", "resources": {"gpu": 4}},
                {"flavor": "a100-80gb-spot", "resources": {"gpu": 4}},
            ],
        }
    ],
    "tenant_queues": [{"tenant": "research", "queue": "team-a"}],
}


def job(name: str, preemptible: bool) -> dict[str, Any]:
    return {
        "name": name,
        "tenant": "research",
        "preemptible": preemptible,
        "pod_groups": [
            {
                "name": "worker",
                "replicas": 1,
                "cpu": "4",
                "memory": "8Gi",
                "gpu": {"count": 2},
                "template": {"spec": {"containers": [{"name": "trainer", "image": TRAINING_IMAGE}]}},
            }
        ],
        "estimated_duration_s": 3600,
    }


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[DevCluster]:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    dev = DevCluster(
        load_cluster(tmp_path / "cluster.yaml"),
        settings=SimSettings(speed=10, pod_start_seconds=0.1),
        duty_cycle=DutyCycleTrace.synthetic(),
    )
    dev.start()
    yield dev
    dev.stop()


async def rows(db: str, query: str, **params: Any) -> list[Any]:
    engine = create_async_engine(async_url(db))
    try:
        async with engine.connect() as conn:
            return list((await conn.execute(text(query), params)).all())
    finally:
        await engine.dispose()


async def test_preemptible_work_runs_and_is_priced_on_spot_and_the_rest_on_demand(
    nats_url: str, fresh_database: str, cluster: DevCluster, tmp_path: Path
) -> None:
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate_all, fresh_database)
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    a_settings = settings_for(
        AdmissionSettings, nats_url, fresh_database, kubeconfig=kubeconfig, cycle_interval_s=0.05
    )
    s_settings = settings_for(SchedulerSettings, nats_url, fresh_database, kubeconfig=kubeconfig, poll_s=0.2)
    t_settings = settings_for(
        TelemetrySettings,
        nats_url,
        fresh_database,
        devcluster_url=cluster.url,
        sample_interval_s=0.5,
        inventory_interval_s=0.5,
        usage={"flush_interval_s": 0.5},
        pricing={
            "flavors": [
                {
                    "name": "a100-80gb",
                    "gpu_model": "A100-80GB",
                    "on_demand_per_gpu_hour": ON_DEMAND_PRICE,
                    "spot_per_gpu_hour": SPOT_PRICE,
                }
            ]
        },
    )
    batch: Any = k8s.BatchV1Api(api_client(kubeconfig=str(kubeconfig)))
    core: Any = k8s.CoreV1Api(api_client(kubeconfig=str(kubeconfig)))
    async with (
        running(telemetry.build(t_settings), t_settings),
        running(scheduler.build(s_settings), s_settings),
        running(admission.build(a_settings), a_settings) as adm,
    ):
        async with adm.ctx.uow() as uow:
            await change_config(uow, lambda cfg: cfg.merged(QueueingDocument.model_validate(QUEUES)))
            await uow.commit()
        ids = {}
        for name, preemptible in (("spot-trainer", True), ("steady-server", False)):
            async with adm.ctx.uow() as uow:
                ids[name] = (await submit_job(job(name, preemptible), uow)).job_id
                await uow.commit()

        async def nodes_of(job_id: str) -> set[str] | None:
            pods = await asyncio.to_thread(
                core.list_namespaced_pod, "default", label_selector=f"tessera.io/job-id={job_id}"
            )
            bound = {p.spec.node_name for p in pods.items if p.spec.node_name}
            return bound or None

        assert await eventually(
            lambda: nodes_of(ids["spot-trainer"]), what="spot pods bound", timeout=60
        ) == {"spot-0"}
        assert await eventually(
            lambda: nodes_of(ids["steady-server"]), what="on-demand pods bound", timeout=60
        ) == {"ondemand-0"}

        jobs = await asyncio.to_thread(batch.list_namespaced_job, "default")
        selectors = {
            j.metadata.labels["tessera.io/job-id"]: (
                j.metadata.annotations["tessera.io/flavor"],
                j.spec.template.spec.node_selector,
            )
            for j in jobs.items
        }
        assert selectors[ids["spot-trainer"]] == ("a100-80gb-spot", {CAPACITY: "spot"})
        assert selectors[ids["steady-server"]] == ("a100-80gb", {CAPACITY: "on-demand"})

        query = (
            "SELECT capacity_type, sum(cost) / (sum(allocated_gpu_s) / 3600.0) FROM telemetry.usage_hourly "
            "WHERE job_id = :job AND allocated_gpu_s > 0 GROUP BY capacity_type"
        )

        async def priced(job_id: str) -> list[Any]:
            return await rows(fresh_database, query, job=job_id)

        spot = await eventually(lambda: priced(ids["spot-trainer"]), what="spot usage rolled up", timeout=60)
        steady = await eventually(lambda: priced(ids["steady-server"]), what="on-demand usage", timeout=60)
    assert [(kind, round(price, 6)) for kind, price in spot] == [("spot", SPOT_PRICE)]
    assert [(kind, round(price, 6)) for kind, price in steady] == [("on-demand", ON_DEMAND_PRICE)]
