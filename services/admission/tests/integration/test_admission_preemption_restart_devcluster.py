"""Admission killed (SIGKILL) in the middle of a preemption loses no workload and unsuspends none
twice. A user's labelled Job runs on all the queue's quota; a higher-priority Job arrives and
admission asks the first to leave (its checkpoint-and-release step has begun) and is killed before
the victim is released. While admission is down the victim's release comes, as the scheduler sends it
after the eviction. Restarted on the same tables and cluster, admission rebuilds the preemption from
its tables and the API, and is killed once more just after it suspended the victim's Job, before it
recorded that. Started again, the victim ends suspended and requeued exactly once, and the preemptor
is admitted and unsuspended exactly once; the victim's suspension is told by one Preempted Event.
Real NATS, Postgres, a real admission process and the devcluster through the official client."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from kubernetes import client as k8s

from tessera.admission.entrypoints.webhook import webhook_configuration
from tessera.cluster.kube import api_client
from tessera.contracts.events import ReportJobOutcome
from tessera.core.messaging.envelope import encode
from tessera.testing.services import ServiceProcess, eventually

from .conftest import scalar
from .test_admission_native_jobs_devcluster import kubeconfig

pytestmark = pytest.mark.integration

__all__ = ["kubeconfig"]  # the fixture: a devcluster of 4 nodes of 8 A100-80GB GPUs

IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
NS = "ml"
QUEUES = {
    "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}],
    "queues": [
        {
            "name": "team-a",
            "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 8}}],
            "preemption": {"within_queue": "lower-priority"},
        }
    ],
    "tenant_queues": [{"tenant": NS, "queue": "team-a"}],
}


def labelled_job(name: str, priority_class: str | None = None) -> dict[str, Any]:
    """One pod of the queue's 8 GPUs."""
    container = {"name": "train", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "8"}}}
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"tessera.io/queue": "team-a"}},
        "spec": {"parallelism": 1, "template": {"spec": spec}},
    }


async def test_admission_killed_mid_preemption_requeues_the_victim_once_and_runs_the_preemptor(
    admission_db: tuple[str, str], kubeconfig: Path, tmp_path: Path
) -> None:
    nats_url, db = admission_db
    api = api_client(kubeconfig=str(kubeconfig))
    batch: Any = k8s.BatchV1Api(api)
    core: Any = k8s.CoreV1Api(api)
    await asyncio.to_thread(core.create_namespace, {"metadata": {"name": NS}})
    urgent_class = {"metadata": {"name": "urgent"}, "value": 100}
    await asyncio.to_thread(k8s.SchedulingV1Api(api).create_priority_class, urgent_class)
    proc = ServiceProcess(
        "admission",
        {
            "TESSERA_NATS_URL": nats_url,
            "TESSERA_DATABASE_URL": db,
            "TESSERA_ADMISSION_AUTH": "disabled",
            "TESSERA_ADMISSION_KUBECONFIG": str(kubeconfig),
            "TESSERA_ADMISSION_CYCLE_INTERVAL_S": "0.05",
            "TESSERA_ADMISSION_OUTBOX_POLL_S": "0.05",
            "TESSERA_ADMISSION_WORKLOAD_SYNC_INTERVAL_S": "0.1",
        },
        tmp_path,
    )

    async def suspended(name: str) -> bool:
        return bool((await asyncio.to_thread(batch.read_namespaced_job, name, NS)).spec.suspend)

    async def job_id(name: str) -> str:
        found = await asyncio.to_thread(batch.read_namespaced_job, name, NS)
        return str(found.metadata.labels["tessera.io/job-id"])

    async def record(http: httpx.AsyncClient, name: str) -> dict[str, Any]:
        return dict((await http.get(f"/v1/jobs/{await job_id(name)}")).json())

    async def events(name: str, reason: str) -> int:
        listed = await asyncio.to_thread(core.list_namespaced_event, NS)
        return sum(1 for e in listed.items if e.involved_object.name == name and e.reason == reason)

    try:
        proc.start()
        await proc.wait_ready()
        async with httpx.AsyncClient(base_url=proc.url) as http:
            assert (await http.put("/v1/config", json=QUEUES)).status_code == 200
            webhooks = k8s.AdmissionregistrationV1Api(api)
            await asyncio.to_thread(
                webhooks.create_mutating_webhook_configuration, webhook_configuration(proc.url)
            )

            await asyncio.to_thread(batch.create_namespaced_job, NS, labelled_job("victim"))
            await eventually(lambda: _false(suspended("victim")), what="the victim admitted and unsuspended")
            victim_id = await job_id("victim")

            await asyncio.to_thread(batch.create_namespaced_job, NS, labelled_job("urgent", "urgent"))
            urgent_id = await job_id("urgent")

            async def asked_to_leave() -> bool:
                found = await record(http, "victim")
                return any(t["reason"].startswith("preemption requested by") for t in found["history"])

            await eventually(asked_to_leave, what="the victim asked to leave", timeout=30)
        # Killed mid-preemption: the victim holds its quota and runs; the preemptor waits for it.
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGKILL)
        assert await proc.wait_exit() == -signal.SIGKILL
        assert await suspended("victim") is False and await suspended("urgent") is True

        # The victim is evicted and released while admission is down, as the scheduler reports it.
        nc = await nats.connect(nats_url)
        try:
            release = ReportJobOutcome(job_id=victim_id, state="preempted", reason="evicted")
            subject, headers, body = encode(release, "tessera/scheduler")
            await nc.jetstream().publish(subject, body, headers=headers)
        finally:
            await nc.close()

        # Restarted, it requeues the victim and suspends its Job, and is killed again in that step: the
        # Job is suspended on the cluster, and admission has neither told of it nor recorded it.
        proc.start({"TESSERA_FAULTS": "admission.event.Preempted"})
        assert await proc.wait_exit(timeout=60) == -signal.SIGKILL
        assert await suspended("victim") is True, "the suspend reached the cluster before the kill"

        proc.start()
        await proc.wait_ready()
        async with httpx.AsyncClient(base_url=proc.url) as http:

            async def settled() -> bool:
                return await suspended("victim") and not await suspended("urgent")

            await eventually(settled, what="the victim suspended and the preemptor running", timeout=60)
            assert (await record(http, "victim"))["state"] == "queued", "requeued, keeping its place"
            assert (await record(http, "urgent"))["state"] == "admitted"

            async def described() -> bool:
                urgent = await asyncio.to_thread(batch.read_namespaced_job_status, "urgent", NS)
                kinds = {c.type: c.status for c in urgent.status.conditions or []}
                return kinds.get("Admitted") == "True"

            await eventually(described, what="the preemptor's conditions written after the restart")
            # A few more rounds of the workload sync: nothing is done twice.
            await asyncio.sleep(1.0)
            # Suspended once: the restarted sync finds it suspended and changes nothing, and tells the
            # Event of that suspension, which died with the process that made it, once.
            assert await events("victim", "Preempted") == 1, "the victim's suspension told once"
            assert await events("victim", "Admitted") == 1, "the victim unsuspended once, before the kill"
            assert await events("urgent", "Admitted") == 1, "the preemptor unsuspended once"
            assert await suspended("victim") is True and await suspended("urgent") is False
    finally:
        proc.stop()

    def transitions(job: str, state: str, reason: str) -> str:
        return (
            "SELECT count(*) FROM admission.job_transitions "
            f"WHERE job_id = '{job}' AND state = '{state}' AND reason LIKE '{reason}%'"
        )

    assert await scalar(db, transitions(victim_id, "preempted", "released after preemption")) == 1
    assert await scalar(db, transitions(victim_id, "queued", "requeued after preemption")) == 1
    assert await scalar(db, transitions(victim_id, "admitted", "admitted to queue")) == 1, (
        "not admitted again"
    )
    assert await scalar(db, transitions(urgent_id, "admitted", "admitted to queue")) == 1, "admitted once"
    assert await scalar(db, "SELECT count(*) FROM admission.jobs") == 2, "no workload lost or adopted twice"


async def _false(probe: Any) -> bool:
    return await probe is False
