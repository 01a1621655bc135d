"""Jobs become Kubernetes objects on the devcluster, read back through the official client: a
suspended Indexed Job per pod group and a headless Service at submission, unsuspended when the job
is admitted, suspended again when it is preempted, deleted when it is cancelled; a restarted
admission neither makes them twice nor unsuspends a running Job again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from kubernetes import client as k8s
from sqlalchemy.ext.asyncio import create_async_engine

from tessera.admission.adapters import orm
from tessera.cluster.kube import api_client
from tessera.core.db.engine import async_url
from tessera.devcluster.runner import DevCluster
from tessera.testing.services import eventually

from .conftest import Api, start_api

pytestmark = pytest.mark.integration

CLUSTER_FILE = Path(__file__).resolve().parents[4] / "examples" / "clusters" / "dev-4x8.yaml"
IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
ONE_QUEUE = {
    "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}],
    "queues": [
        {
            "name": "team-a",
            "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 8}}],
            "preemption": {"within_queue": "lower-priority"},
        }
    ],
    "tenant_queues": [{"tenant": "research", "queue": "team-a"}],
}


def job(name: str, priority: int = 0, replicas: int = 2) -> dict[str, Any]:
    return {
        "name": name,
        "tenant": "research",
        "priority": priority,
        "pod_groups": [
            {
                "name": "worker",
                "replicas": replicas,
                "gpu": {"count": 4, "models": ["A100-80GB"]},
                "template": {
                    "spec": {
                        "containers": [
                            {"name": "trainer", "image": IMAGE, "command": ["torchrun", "train.py"]}
                        ]
                    }
                },
            }
        ],
    }


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[DevCluster, Path]]:
    with DevCluster.from_file(CLUSTER_FILE, speed=20.0) as dev:
        yield dev, dev.write_kubeconfig(tmp_path / "kubeconfig")


class Kube:
    def __init__(self, kubeconfig: Path) -> None:
        self.batch = k8s.BatchV1Api(api_client(kubeconfig=str(kubeconfig)))
        self.core = k8s.CoreV1Api(self.batch.api_client)

    async def jobs_of(self, job_id: str) -> list[Any]:
        found = await asyncio.to_thread(
            self.batch.list_namespaced_job, "default", label_selector=f"tessera.io/job-id={job_id}"
        )
        return list(found.items)

    async def suspended(self, job_id: str) -> list[bool]:
        return [bool(j.spec.suspend) for j in await self.jobs_of(job_id)]

    async def admitted_condition(self, job_id: str) -> bool:
        """Admission wrote the job's conditions for its admission (the last change it makes)."""
        (found,) = await self.jobs_of(job_id)
        return any(c.type == "Admitted" and c.status == "True" for c in found.status.conditions or [])

    async def services_of(self, job_id: str) -> list[Any]:
        found = await asyncio.to_thread(
            self.core.list_namespaced_service, "default", label_selector=f"tessera.io/job-id={job_id}"
        )
        return list(found.items)


@contextlib.asynccontextmanager
async def admission(db: tuple[str, str], kubeconfig: Path) -> AsyncIterator[Api]:
    async for api in start_api(*db, auth="disabled", kubeconfig=kubeconfig):
        yield api


async def submit(api: Api, job_id: str, spec: dict[str, Any]) -> None:
    response = await api.client.post("/v1/jobs", json=spec, headers={"Idempotency-Key": job_id})
    assert response.status_code == 201, response.text


async def asked_to_leave(api: Api, job_id: str) -> bool:
    history = (await api.client.get(f"/v1/jobs/{job_id}")).json()["history"]
    return any("preemption requested" in step["reason"] for step in history)


async def state(api: Api, job_id: str) -> str:
    return str((await api.client.get(f"/v1/jobs/{job_id}")).json()["state"])


async def test_a_job_is_suspended_jobs_until_admitted_and_follows_its_state(
    admission_db: tuple[str, str], cluster: tuple[DevCluster, Path]
) -> None:
    kube = Kube(cluster[1])
    async with admission(admission_db, cluster[1]) as api:
        assert (await api.client.put("/v1/config", json=ONE_QUEUE)).status_code == 200
        await submit(api, "first", job("first"))
        await eventually(lambda: kube.suspended("first"), what="first's Job made")
        await eventually(lambda: _equal(kube.suspended("first"), [False]), what="first admitted, unsuspended")
        (made,) = await kube.jobs_of("first")
        spec = made.spec
        assert (spec.completion_mode, spec.parallelism, spec.completions) == ("Indexed", 2, 2)
        pod = spec.template.spec
        assert pod.scheduler_name == "tessera" and pod.containers[0].image == IMAGE
        assert pod.containers[0].resources.limits == {"nvidia.com/gpu": "4"}
        env = {e.name: e.value for e in pod.containers[0].env}
        assert env["WORLD_SIZE"] == "2" and env["TESSERA_JOB_ID"] == "first"
        (service,) = await kube.services_of("first")
        assert service.spec.cluster_ip == "None"
        assert env["MASTER_ADDR"].startswith(f"{made.metadata.name}-0.{service.metadata.name}.")

        # A second job over quota waits suspended.
        await submit(api, "second", job("second", replicas=1))
        await eventually(lambda: _equal(kube.suspended("second"), [True]), what="second made, suspended")
        assert await state(api, "second") == "queued"
        second = (await api.client.get("/v1/jobs/second")).json()
        assert second["kubernetes"] == {
            "namespace": "default",
            "objects": [
                {"kind": "Service", "name": "second-second"},
                {"kind": "Job", "name": "second-second-worker"},
            ],
            "state": "suspended",
            "note": "",
        }

        async def waits_for_quota() -> bool:  # the cycle records why after the Job is made
            waiting = (await api.client.get("/v1/jobs/second")).json()["waiting"]
            return waiting is not None and waiting["reason"] == "QuotaExhausted"

        await eventually(waits_for_quota, what="second waits with reason QuotaExhausted")

        # A higher-priority job preempts the first: once the first is released it is suspended again.
        await submit(api, "urgent", job("urgent", priority=100))
        await eventually(lambda: asked_to_leave(api, "first"), what="first asked to leave")
        response = await api.client.post(
            "/v1/jobs/first/outcome", json={"state": "preempted", "reason": "evicted"}
        )
        assert response.status_code == 200, response.text
        await eventually(lambda: _equal(kube.suspended("first"), [True]), what="first suspended again")
        await eventually(lambda: _equal(kube.suspended("urgent"), [False]), what="urgent unsuspended")

        # Cancelling deletes the objects; the quota it held lets the preempted job resume first.
        assert (await api.client.post("/v1/jobs/urgent/cancel")).status_code == 200
        await eventually(lambda: _equal(kube.jobs_of("urgent"), []), what="urgent's Job deleted")
        assert await kube.services_of("urgent") == []
        await eventually(lambda: _equal(kube.suspended("first"), [False]), what="first resumed")
        assert await kube.suspended("second") == [True], "second still waits: first came before it"
        await eventually(lambda: kube.admitted_condition("first"), what="first's Admitted condition")
        running = (await kube.jobs_of("first"))[0].metadata.resource_version

    # Restarted: nothing made twice, nothing unsuspended again.
    async with admission(admission_db, cluster[1]) as api:
        await submit(api, "third", job("third", replicas=1))
        await eventually(lambda: kube.jobs_of("third"), what="the restarted admission makes objects")
        (first,) = await kube.jobs_of("first")
        assert first.metadata.resource_version == running, "a running Job is not touched again"
        assert await kube.suspended("second") == [True]
        assert len(await kube.services_of("first")) == 1


async def test_without_a_template_a_job_is_refused_naming_the_path(
    admission_db: tuple[str, str], cluster: tuple[DevCluster, Path]
) -> None:
    async with admission(admission_db, cluster[1]) as api:
        spec = job("bare")
        del spec["pod_groups"][0]["template"]
        response = await api.client.post("/v1/jobs", json=spec)
        assert response.status_code == 422
        assert response.json()["field"] == "pod_groups[0].template"
        spec = job("no-image")
        del spec["pod_groups"][0]["template"]["spec"]["containers"][0]["image"]
        response = await api.client.post("/v1/jobs", json=spec)
        assert response.status_code == 422
        assert response.json()["message"] == (
            "the job is rejected: pod_groups[0].template.spec.containers[0].image: required"
        )


async def _equal(probe: Any, expected: Any) -> bool:
    return bool(await probe == expected)


async def test_the_migrations_build_the_workloads_table_the_repository_uses(
    admission_db: tuple[str, str],
) -> None:
    def diff(connection: Any) -> list[Any]:
        context = MigrationContext.configure(
            connection,
            opts={
                "include_schemas": True,
                "include_name": lambda name, kind, parent: kind != "table" or name == "workloads",
            },
        )
        return [d for d in compare_metadata(context, orm.metadata) if "workloads" in repr(d)]

    engine = create_async_engine(async_url(admission_db[1]))
    try:
        async with engine.connect() as conn:
            assert await conn.run_sync(diff) == []
    finally:
        await engine.dispose()
