"""A job submitted by the NATS command (`tessera.admission.cmd.submit_job`) while admission runs
workloads on the devcluster is held to what REST holds it to: without a pod template it is rejected
naming `pod_groups[0].template`, as REST answers 422; a valid one becomes a suspended Indexed
batch/v1 Job, read back through the official client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from kubernetes import client as k8s
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from tessera.cluster.kube import api_client
from tessera.contracts import subjects
from tessera.contracts.events import JobRejected, SubmitJob
from tessera.core.messaging.envelope import encode
from tessera.devcluster.runner import DevCluster
from tessera.testing.services import eventually, read_stream

from .conftest import start_api

pytestmark = pytest.mark.integration

CLUSTER_FILE = Path(__file__).resolve().parents[4] / "examples" / "clusters" / "dev-4x8.yaml"
IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
QUEUES = {  # 8 GPUs of quota, all held by a job admitted first: the next stays queued, suspended
    "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}],
    "queues": [{"name": "team-a", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 8}}]}],
    "tenant_queues": [{"tenant": "research", "queue": "team-a"}],
}


def job(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "tenant": "research",
        "pod_groups": [
            {
                "name": "worker",
                "replicas": 2,
                "gpu": {"count": 4, "models": ["A100-80GB"]},
                "template": {
                    "spec": {"containers": [{"name": "trainer", "image": IMAGE, "command": ["torchrun"]}]}
                },
            }
        ],
    }


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    with DevCluster.from_file(CLUSTER_FILE, speed=20.0) as dev:
        yield dev.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
async def submitter(nats_url: str) -> AsyncIterator[NATS]:
    nc = await nats.connect(nats_url)
    yield nc
    await nc.close()


async def publish(js: JetStreamContext, job_id: str, spec: dict[str, Any]) -> None:
    subject, headers, body = encode(SubmitJob(job_id=job_id, spec=spec), "tessera/test")
    assert subject == subjects.SUBMIT_JOB
    await js.publish(subject, body, headers=headers)


async def test_a_nats_submission_needs_a_template_and_becomes_a_suspended_indexed_job(
    admission_db: tuple[str, str], kubeconfig: Path, submitter: NATS
) -> None:
    batch = k8s.BatchV1Api(api_client(kubeconfig=str(kubeconfig)))

    async def jobs_of(job_id: str) -> list[Any]:
        found = await asyncio.to_thread(
            batch.list_namespaced_job, "default", label_selector=f"tessera.io/job-id={job_id}"
        )
        return list(found.items)

    async for api in start_api(*admission_db, auth="disabled", kubeconfig=kubeconfig):
        assert (await api.client.put("/v1/config", json=QUEUES)).status_code == 200
        blocker = await api.client.post(
            "/v1/jobs", json=job("blocker"), headers={"Idempotency-Key": "blocker"}
        )
        assert blocker.status_code == 201, blocker.text
        await eventually(
            lambda client=api.client: _state(client, "blocker", "admitted"),
            timeout=30,
            what="blocker admitted",
        )
        js = submitter.jetstream()
        bare = job("bare")
        del bare["pod_groups"][0]["template"]
        await publish(js, "bare", bare)
        await publish(js, "valid", job("valid"))

        rejected = await eventually(
            lambda js=js: _rejection(js, "bare"), timeout=30, what="the bare submission rejected"
        )
        assert [(e.field, e.reason) for e in rejected.errors] == [
            ("pod_groups[0].template", "required: the pods' image and command to run")
        ]
        stored = (await api.client.get("/v1/jobs/bare")).json()
        assert stored["state"] == "rejected"
        assert [e["field"] for e in stored["errors"]] == ["pod_groups[0].template"]
        # the REST answer names the same field
        response = await api.client.post("/v1/jobs", json=bare)
        assert response.status_code == 422 and response.json()["field"] == "pod_groups[0].template"

        (made,) = await eventually(lambda: jobs_of("valid"), timeout=30, what="valid's Job made")
        assert made.api_version == "batch/v1" and made.kind == "Job"
        assert (made.spec.completion_mode, made.spec.parallelism, made.spec.completions) == ("Indexed", 2, 2)
        assert made.spec.suspend is True
        assert made.spec.template.spec.containers[0].image == IMAGE
        assert made.spec.template.spec.scheduler_name == "tessera"
        assert (await api.client.get("/v1/jobs/valid")).json()["state"] == "queued"
        assert await jobs_of("bare") == [], "a rejected job makes nothing"
        # still suspended once the cycle has looked at it: the blocker holds the 8 GPUs
        await eventually(
            lambda client=api.client: _waits(client, "valid"), timeout=30, what="valid waits for quota"
        )
        assert [j.spec.suspend for j in await jobs_of("valid")] == [True]


async def _rejection(js: JetStreamContext, job_id: str) -> JobRejected | None:
    for envelope in await read_stream(js, subjects.JOB_REJECTED, idle_s=0.2):
        message = envelope.parse()
        if isinstance(message, JobRejected) and message.job_id == job_id:
            return message
    return None


async def _state(client: Any, job_id: str, state: str) -> bool:
    return bool((await client.get(f"/v1/jobs/{job_id}")).json()["state"] == state)


async def _waits(client: Any, job_id: str) -> bool:
    waiting = (await client.get(f"/v1/jobs/{job_id}")).json()["waiting"]
    return waiting is not None and waiting["reason"] == "QuotaExhausted"
