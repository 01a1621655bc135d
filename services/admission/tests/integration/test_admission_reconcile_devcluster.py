"""Reconciliation on the devcluster, read through the official client, with real NATS and Postgres.

No scheduler runs here, so admission hears no `gang_placed`, `running` or `gang_finished`: the only way
its jobs can follow their pods is reconciliation. A job whose pods all run becomes running, one whose
pods all succeeded ends succeeded (its quota freed), and one whose Jobs someone deleted has them made
again. Nothing is repaired while pods are pending or while a job changed within the grace."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from prometheus_client import CollectorRegistry

from tessera.admission.adapters.kube import KubeWorkloads
from tessera.admission.config import AuthMode
from tessera.admission.domain.reconcile import Repair
from tessera.admission.entrypoints.reconcile import Reconciliation
from tessera.admission.service_layer.dependencies import AdmissionDeps
from tessera.cluster.kube import api_client
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.testing import api_client as devcluster_client
from tessera.devcluster.testing import binding_scheduler, start_cluster
from tessera.testing.services import eventually

from .conftest import Api, start_api

pytestmark = pytest.mark.integration

IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
CONFIG = {
    "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}],
    "queues": [{"name": "team-a", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 8}}]}],
    "tenant_queues": [{"tenant": "research", "queue": "team-a"}],
}


def job(name: str, duration_s: int) -> dict[str, Any]:
    return {
        "name": name,
        "tenant": "research",
        "estimated_duration_s": duration_s,
        "pod_groups": [
            {
                "name": "worker",
                "replicas": 2,
                "gpu": {"count": 1, "models": ["A100-80GB"]},
                "template": {"spec": {"containers": [{"name": "trainer", "image": IMAGE}]}},
            }
        ],
    }


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[DevCluster, Path]]:
    dev = start_cluster()
    try:
        yield dev, dev.write_kubeconfig(tmp_path / "kubeconfig")
    finally:
        dev.stop()


async def state_of(api: Api, job_id: str) -> str:
    return str((await api.client.get(f"/v1/jobs/{job_id}")).json()["state"])


async def phases(core: k8s.CoreV1Api, job_id: str) -> list[str]:
    pods = await asyncio.to_thread(
        core.list_namespaced_pod, "default", label_selector=f"tessera.io/job-id={job_id}"
    )
    return sorted(str(p.status.phase) for p in pods.items)


async def kube_jobs(batch: k8s.BatchV1Api, job_id: str) -> list[str]:
    found = await asyncio.to_thread(
        batch.list_namespaced_job, "default", label_selector=f"tessera.io/job-id={job_id}"
    )
    return [j.metadata.name for j in found.items]


async def test_reconciliation_moves_jobs_to_what_their_pods_show(
    admission_db: tuple[str, str], cluster: tuple[DevCluster, Path]
) -> None:
    dev, kubeconfig = cluster
    kube_api = api_client(kubeconfig=str(kubeconfig))
    core, batch = k8s.CoreV1Api(kube_api), k8s.BatchV1Api(kube_api)
    # The service's own passes get an hour's grace, so on a slow machine they cannot repair "gone"
    # before the test's own pass does.
    async for api in start_api(
        *admission_db, auth="disabled", kubeconfig=kubeconfig, reconcile_grace_s=3600.0
    ):
        deps = AdmissionDeps(api.ctx, AuthMode.DISABLED, None, 0.05, 10.0)
        registry = CollectorRegistry()
        right_away = Reconciliation(deps, KubeWorkloads(kube_api), registry, timedelta(0))
        patient = Reconciliation(deps, KubeWorkloads(kube_api), CollectorRegistry(), timedelta(hours=1))

        async def exposed(api: Api = api) -> bool:
            text = (await api.client.get("/metrics")).text
            return 'tessera_admission_reconcile_repairs_total{repair="recreate"} 0.0' in text

        await eventually(exposed, what="with a cluster, the service runs its own reconciliation")
        assert (await api.client.put("/v1/config", json=CONFIG)).status_code == 200
        for job_id, duration in (("long", 3600), ("short", 1), ("gone", 3600)):
            response = await api.client.post(
                "/v1/jobs", json=job(job_id, duration), headers={"Idempotency-Key": job_id}
            )
            assert response.status_code == 201, response.text

        async def pods_pending(api: Api = api) -> bool:
            return all(
                [
                    await phases(core, j) == ["Pending", "Pending"] and await applied(api, j) == "running"
                    for j in ("long", "short", "gone")
                ]
            )

        # Admission's round has recorded each job's Jobs unsuspended: "gone"'s deleted before then
        # would be made again by that round itself, or left to it while it is under way, and no
        # reconciliation would have them to make again.
        await eventually(pods_pending, what="admitted, unsuspended, pods made and waiting for a node")
        assert await right_away.run_pass() == [], "pending pods prove nothing"

        # The Jobs of "gone" are deleted behind admission's back, once unsuspended, before anything runs.
        for name in await kube_jobs(batch, "gone"):
            await asyncio.to_thread(
                batch.delete_namespaced_job, name, "default", propagation_policy="Background"
            )

        async def gone() -> bool:
            return await kube_jobs(batch, "gone") == [] and await phases(core, "gone") == []

        await eventually(gone, what="gone's Jobs and pods deleted")

        with devcluster_client(dev) as binder, binding_scheduler(binder):

            async def settled() -> bool:
                return (await phases(core, "long"), await phases(core, "short")) == (
                    ["Running", "Running"],
                    ["Succeeded", "Succeeded"],
                )

            await eventually(settled, what="long's pods running, short's succeeded")
            assert await patient.run_pass() == [], "jobs that changed within the grace are left alone"
            assert {(r.job_id, r.repair) for r in await right_away.run_pass()} == {
                ("long", Repair.RUNNING),
                ("short", Repair.SUCCEEDED),
                ("gone", Repair.RECREATE),
            }

            long = (await api.client.get("/v1/jobs/long")).json()
            assert [(h["state"], h["reason"]) for h in long["history"][-2:]] == [
                ("placed", "placed: implied by the running report that came first"),
                ("running", "reconciled: all 2 pods Running"),
            ]
            short = (await api.client.get("/v1/jobs/short")).json()
            assert (short["state"], short["history"][-1]["reason"]) == (
                "succeeded",
                "reconciled: all 2 pods Succeeded",
            )
            gone_history = (await api.client.get("/v1/jobs/gone")).json()["history"]
            assert "its Kubernetes Jobs are gone from the API" in gone_history[-1]["reason"]
            await eventually(lambda: kube_jobs(batch, "gone"), what="gone's Jobs made again")

            async def gone_runs() -> bool:
                return await phases(core, "gone") == ["Running", "Running"]

            await eventually(gone_runs, what="gone's new pods running")

            # Repaired once: a second pass finds nothing more to do but gone's new pods running.
            assert [(r.job_id, r.repair) for r in await right_away.run_pass()] == [("gone", Repair.RUNNING)]
            assert await right_away.run_pass() == []
        assert await state_of(api, "long") == "running"
        for repair, count in {"running": 2, "succeeded": 1, "recreate": 1, "failed": 0}.items():
            sample = registry.get_sample_value(
                "tessera_admission_reconcile_repairs_total", {"repair": repair}
            )
            assert sample == count, repair
        assert await api.scalar("SELECT count(*) FROM admission.placements WHERE job_id = 'short'") == 0


async def test_jobs_deleted_while_the_job_queued_are_made_again_when_it_is_admitted(
    admission_db: tuple[str, str], cluster: tuple[DevCluster, Path]
) -> None:
    """Admission makes a queued job's Jobs suspended; deleted then, they are made again by the round
    that unsuspends them once the job is admitted (reconciliation makes again only the Jobs of a job
    that ran), so the job runs rather than holding its quota with nothing on the cluster."""
    _, kubeconfig = cluster
    kube_api = api_client(kubeconfig=str(kubeconfig))
    core, batch = k8s.CoreV1Api(kube_api), k8s.BatchV1Api(kube_api)
    async for api in start_api(*admission_db, auth="disabled", kubeconfig=kubeconfig):
        room_for_one = [{"name": "team-a", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 2}}]}]
        response = await api.client.put("/v1/config", json={**CONFIG, "queues": room_for_one})
        assert response.status_code == 200
        for job_id in ("first", "queued"):
            response = await api.client.post(
                "/v1/jobs", json=job(job_id, 3600), headers={"Idempotency-Key": job_id}
            )
            assert response.status_code == 201, response.text

        async def made_suspended(api: Api = api) -> bool:
            return await applied(api, "queued") == "suspended" and await kube_jobs(batch, "queued") != []

        await eventually(made_suspended, what="the queued job's Jobs made, suspended")
        assert await state_of(api, "queued") == "queued"
        for name in await kube_jobs(batch, "queued"):
            await asyncio.to_thread(
                batch.delete_namespaced_job, name, "default", propagation_policy="Background"
            )

        async def deleted() -> bool:
            return await kube_jobs(batch, "queued") == []

        await eventually(deleted, what="the queued job's Jobs deleted")
        assert (await api.client.put("/v1/config", json=CONFIG)).status_code == 200  # room for both

        async def runs(api: Api = api) -> bool:
            return (
                await state_of(api, "queued"),
                await phases(core, "queued"),
                await applied(api, "queued"),
            ) == ("admitted", ["Pending", "Pending"], "running")

        await eventually(runs, what="admitted, its Jobs made again, unsuspended and recorded so")


async def applied(api: Api, job_id: str) -> str:
    """What admission recorded it made sure of for the job's objects ('' when nothing yet)."""
    query = "SELECT coalesce((SELECT applied FROM admission.workloads WHERE job_id = :job_id), '')"
    return str(await api.scalar(query, job_id=job_id))
