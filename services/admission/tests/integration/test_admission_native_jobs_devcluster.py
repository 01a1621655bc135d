"""A user's own batch/v1 Job, labelled `tessera.io/queue` and applied with the official client, is
queued by admission as kubectl users expect of Kueue: held suspended by the webhook, admitted
against its namespace's quota (the namespace is the tenant), unsuspended when admitted; one over
quota stays suspended and says why; deleting the first frees its quota for the second; a Job
labelled with a queue its namespace may not use is rejected and stays suspended."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from kubernetes import client as k8s

from tessera.admission.bootstrap import build
from tessera.admission.config import AdmissionSettings
from tessera.cluster.kube import api_client
from tessera.core.runner import create_app
from tessera.devcluster.runner import DevCluster
from tessera.testing.services import eventually, settings_for

from .test_admission_webhook_devcluster import register

pytestmark = pytest.mark.integration

CLUSTER_FILE = Path(__file__).resolve().parents[4] / "examples" / "clusters" / "dev-4x8.yaml"
IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
NS = "ml"
QUEUES = {
    "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}],
    "queues": [
        {"name": "team-a", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 4}}]},
        {"name": "team-b", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 4}}]},
    ],
    "tenant_queues": [{"tenant": NS, "queue": "team-a"}, {"tenant": "other", "queue": "team-b"}],
}


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    with DevCluster.from_file(CLUSTER_FILE, speed=20.0) as dev:
        yield dev.write_kubeconfig(tmp_path / "kubeconfig")


@contextlib.asynccontextmanager
async def serving(db: tuple[str, str], kubeconfig: Path) -> AsyncIterator[str]:
    settings = settings_for(
        AdmissionSettings, *db, auth="disabled", kubeconfig=kubeconfig, cycle_interval_s=0.05
    )
    server = uvicorn.Server(uvicorn.Config(create_app(build(settings), settings), host="127.0.0.1", port=0))
    task = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: _started(server), what="admission serving HTTP")
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        await task


async def _started(server: uvicorn.Server) -> bool:
    return server.started


def labelled_job(name: str, queue: str, gpus: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"tessera.io/queue": queue}},
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "parallelism": 2,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "ddp",
                            "image": IMAGE,
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                }
            },
        },
    }


async def test_a_labelled_job_is_queued_admitted_released_and_deleted_through_admission(
    admission_db: tuple[str, str], kubeconfig: Path
) -> None:
    api = api_client(kubeconfig=str(kubeconfig))
    batch, core = k8s.BatchV1Api(api), k8s.CoreV1Api(api)
    await asyncio.to_thread(core.create_namespace, {"metadata": {"name": NS}})

    async def suspended(name: str) -> bool | None:
        found = await asyncio.to_thread(batch.read_namespaced_job, name, NS)
        return bool(found.spec.suspend)

    async def job_of(http: httpx.AsyncClient, name: str) -> dict[str, Any]:
        found = await asyncio.to_thread(batch.read_namespaced_job, name, NS)
        job_id = found.metadata.labels["tessera.io/job-id"]
        return dict((await http.get(f"/v1/jobs/{job_id}")).json())

    async with serving(admission_db, kubeconfig) as url, httpx.AsyncClient(base_url=url) as http:
        assert (await http.put("/v1/config", json=QUEUES)).status_code == 200
        await asyncio.to_thread(register, api, url)

        await asyncio.to_thread(batch.create_namespaced_job, NS, labelled_job("first", "team-a"))
        assert await suspended("first") is True, "held at creation"
        await eventually(lambda: _not(suspended("first")), what="first admitted and unsuspended")
        first = await job_of(http, "first")
        assert (first["tenant"], first["queue"], first["state"]) == (NS, "team-a", "admitted")

        async def made() -> list[Any]:
            found = await asyncio.to_thread(core.list_namespaced_pod, NS, label_selector="job-name=first")
            return list(found.items)

        pods = await eventually(made, what="the Job controller's pods")
        assert {p.spec.scheduler_name for p in pods} == {"tessera"}
        assert {p.metadata.labels["tessera.io/job-id"] for p in pods} == {first["id"]}

        # Over quota: held, and the job resource says why.
        await asyncio.to_thread(batch.create_namespaced_job, NS, labelled_job("second", "team-a"))
        await eventually(lambda: _queued(job_of(http, "second")), what="second adopted and queued")
        second = await eventually(lambda: _waiting(job_of(http, "second")), what="second's reason")
        assert second["waiting"]["reason"] == "QuotaExhausted" and await suspended("second") is True

        # A queue the namespace may not use: rejected, and the Job stays suspended.
        await asyncio.to_thread(batch.create_namespaced_job, NS, labelled_job("sneaky", "team-b"))
        await eventually(lambda: _rejected(job_of(http, "sneaky")), what="sneaky rejected")
        rejected = await job_of(http, "sneaky")
        assert rejected["errors"][0]["field"] == "queue", rejected["errors"]
        assert await suspended("sneaky") is True

        async def events_of(name: str) -> list[tuple[str, str, str]]:
            listed = await asyncio.to_thread(core.list_namespaced_event, NS)
            return [(e.type, e.reason, e.message) for e in listed.items if e.involved_object.name == name]

        async def with_reason(name: str, kind: str, reason: str) -> list[tuple[str, str, str]]:
            found = await events_of(name)
            return found if (kind, reason) in [(k, r) for k, r, _ in found] else []

        # Each Event is written just after the state the job resource shows.
        found = await eventually(lambda: with_reason("sneaky", "Warning", "Inadmissible"), what="a Warning")
        (warning,) = [e for e in found if e[0] == "Warning"]
        assert "may submit only to its own queue 'team-a'" in warning[2], warning
        await eventually(lambda: with_reason("first", "Normal", "Admitted"), what="first's Admitted Event")
        await eventually(lambda: with_reason("second", "Normal", "Queued"), what="second's Queued Event")

        # Deleting the first cancels its job; its quota admits the second.
        await asyncio.to_thread(batch.delete_namespaced_job, "first", NS)
        await eventually(lambda: _state(http, first["id"], "cancelled"), what="first cancelled")
        await eventually(lambda: _not(suspended("second")), what="second admitted and unsuspended")


async def _not(probe: Any) -> bool:
    return await probe is False


async def _queued(probe: Any) -> bool:
    return (await probe).get("state") == "queued"


async def _waiting(probe: Any) -> dict[str, Any] | None:
    job: dict[str, Any] = await probe
    return job if job.get("waiting") else None


async def _rejected(probe: Any) -> bool:
    return (await probe).get("state") == "rejected"


async def _state(http: httpx.AsyncClient, job_id: str, state: str) -> bool:
    return bool((await http.get(f"/v1/jobs/{job_id}")).json()["state"] == state)
