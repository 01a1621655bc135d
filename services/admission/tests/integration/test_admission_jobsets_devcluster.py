"""The example JobSet (a driver and workers), labelled `tessera.io/queue` and applied with the official
client, is one Tessera job: held suspended by admission's webhook, admitted as one gang, and every pod
of its child Jobs bound by Tessera's scheduler; a higher-priority Job preempts it and it is suspended
again, with its child Jobs; deleted, its job is cancelled and its quota admits the next. Admission
restarted while one JobSet runs and another waits adopts neither again and unsuspends neither twice."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml
from kubernetes import client as k8s

from tessera.admission.bootstrap import build
from tessera.admission.config import AdmissionSettings
from tessera.admission.entrypoints.webhook import webhook_configuration
from tessera.cluster.kube import api_client
from tessera.core.db.migrations import migrate_all
from tessera.core.runner import create_app
from tessera.devcluster.runner import DevCluster
from tessera.scheduler import bootstrap as scheduler
from tessera.scheduler.config import SchedulerSettings
from tessera.testing.services import eventually, reset_jetstream, running, settings_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[4]
CLUSTER_FILE = ROOT / "examples" / "clusters" / "dev-4x8.yaml"
EXAMPLE = ROOT / "examples" / "k8s" / "jobset-driver-workers.yaml"
JOBSET = ("jobset.x-k8s.io", "v1alpha2")
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


@contextlib.asynccontextmanager
async def serving(settings: AdmissionSettings) -> AsyncIterator[str]:
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


def labelled_job(name: str, gpus: int, priority_class: str | None = None) -> dict[str, Any]:
    container = {
        "name": "train",
        "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"tessera.io/queue": "team-a"}},
        "spec": {
            "parallelism": 1,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    **({"priorityClassName": priority_class} if priority_class else {}),
                }
            },
        },
    }


class Cluster:
    def __init__(self, kubeconfig: Path) -> None:
        api = api_client(kubeconfig=str(kubeconfig))
        self.api = api
        self.custom, self.batch, self.core = (
            k8s.CustomObjectsApi(api),
            k8s.BatchV1Api(api),
            k8s.CoreV1Api(api),
        )

    async def jobset(self, name: str) -> dict[str, Any]:
        found = await asyncio.to_thread(
            self.custom.get_namespaced_custom_object, *JOBSET, NS, "jobsets", name
        )
        return dict(found)

    async def suspended(self, name: str) -> bool:
        return bool((await self.jobset(name))["spec"].get("suspend"))

    async def children_suspended(self, name: str) -> list[bool]:
        found = await asyncio.to_thread(
            self.batch.list_namespaced_job, NS, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}"
        )
        return sorted(bool(j.spec.suspend) for j in found.items)

    async def pods(self, job_id: str) -> list[Any]:
        found = await asyncio.to_thread(
            self.core.list_namespaced_pod, NS, label_selector=f"tessera.io/job-id={job_id}"
        )
        return [p for p in found.items if p.metadata.deletion_timestamp is None]


async def test_the_example_jobset_is_one_gang_admitted_bound_preempted_and_deleted(
    nats_url: str, fresh_database: str, tmp_path: Path
) -> None:
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate_all, fresh_database)
    example = yaml.safe_load(EXAMPLE.read_text())
    name = example["metadata"]["name"]
    with DevCluster.from_file(CLUSTER_FILE, speed=20.0) as dev:
        kubeconfig = dev.write_kubeconfig(tmp_path / "kubeconfig")
        kube = Cluster(kubeconfig)
        await asyncio.to_thread(kube.core.create_namespace, {"metadata": {"name": NS}})
        urgent_class = {"metadata": {"name": "urgent"}, "value": 100}
        await asyncio.to_thread(k8s.SchedulingV1Api(kube.api).create_priority_class, urgent_class)
        a_settings = settings_for(
            AdmissionSettings,
            nats_url,
            fresh_database,
            auth="disabled",
            kubeconfig=kubeconfig,
            cycle_interval_s=0.05,
        )
        s_settings = settings_for(
            SchedulerSettings, nats_url, fresh_database, kubeconfig=kubeconfig, poll_s=0.2
        )
        async with (
            running(scheduler.build(s_settings), s_settings),
            serving(a_settings) as url,
            httpx.AsyncClient(base_url=url) as http,
        ):
            assert (await http.put("/v1/config", json=QUEUES)).status_code == 200
            admission_api = k8s.AdmissionregistrationV1Api(kube.api)
            await asyncio.to_thread(
                admission_api.create_mutating_webhook_configuration, webhook_configuration(url)
            )

            await asyncio.to_thread(
                kube.custom.create_namespaced_custom_object, *JOBSET, NS, "jobsets", example
            )
            held = await kube.jobset(name)
            assert held["spec"]["suspend"] is True, "held at creation"
            job_id = held["metadata"]["labels"]["tessera.io/job-id"]

            async def job() -> dict[str, Any]:
                return dict((await http.get(f"/v1/jobs/{job_id}")).json())

            async def bound() -> list[Any] | None:
                pods = await kube.pods(job_id)
                return pods if len(pods) == 3 and all(p.spec.node_name for p in pods) else None

            pods = await eventually(bound, timeout=60, what="all three pods of the JobSet bound")
            spec = await job()
            assert (spec["tenant"], spec["queue"]) == (NS, "team-a")
            groups = {g["name"]: g["replicas"] for g in spec["spec"]["pod_groups"]}
            assert groups == {"driver": 1, "workers": 2}
            assert {p.spec.scheduler_name for p in pods} == {"tessera"}
            groups_of_pods = sorted(p.metadata.labels["tessera.io/pod-group-name"] for p in pods)
            assert groups_of_pods == ["driver", "workers", "workers"]
            assert await kube.children_suspended(name) == [False, False, False]

            # A higher-priority Job over what quota is left preempts the JobSet: suspended, with its Jobs.
            await asyncio.to_thread(kube.batch.create_namespaced_job, NS, labelled_job("urgent", 4, "urgent"))

            async def preempted() -> bool:
                return await kube.suspended(name) and await kube.children_suspended(name) == [True] * 3

            await eventually(preempted, timeout=60, what="the JobSet and its Jobs suspended again")
            await eventually(lambda: _none(kube.pods(job_id)), timeout=60, what="its pods gone")
            assert (await job())["state"] in ("queued", "preempted")

            async def events() -> list[tuple[str, str]]:
                listed = await asyncio.to_thread(kube.core.list_namespaced_event, NS)
                return [
                    (e.reason, e.involved_object.kind) for e in listed.items if e.involved_object.name == name
                ]

            assert {("Admitted", "JobSet"), ("Preempted", "JobSet")} <= set(await events())

            # Deleted: its job is cancelled and it holds no quota.
            await asyncio.to_thread(kube.custom.delete_namespaced_custom_object, *JOBSET, NS, "jobsets", name)
            await eventually(
                lambda: _state(job(), "cancelled"), timeout=30, what="the JobSet's job cancelled"
            )
            await asyncio.to_thread(kube.batch.create_namespaced_job, NS, labelled_job("next", 4))

            async def next_running() -> bool:
                found = await asyncio.to_thread(kube.batch.read_namespaced_job, "next", NS)
                return found.spec.suspend is False

            await eventually(next_running, timeout=30, what="the quota left admits the next Job")


async def _none(probe: Any) -> bool:
    return not await probe


async def _state(probe: Any, state: str) -> bool:
    return (await probe).get("state") == state


async def test_a_restarted_admission_adopts_no_jobset_twice_and_unsuspends_none_twice(
    nats_url: str, fresh_database: str, tmp_path: Path
) -> None:
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate_all, fresh_database)
    example = yaml.safe_load(EXAMPLE.read_text())
    first, second = example, {**example, "metadata": {**example["metadata"], "name": "second"}}
    with DevCluster.from_file(CLUSTER_FILE, speed=20.0) as dev:
        kubeconfig = dev.write_kubeconfig(tmp_path / "kubeconfig")
        kube = Cluster(kubeconfig)
        webhooks = k8s.AdmissionregistrationV1Api(kube.api)
        await asyncio.to_thread(kube.core.create_namespace, {"metadata": {"name": NS}})
        settings = settings_for(
            AdmissionSettings,
            nats_url,
            fresh_database,
            auth="disabled",
            kubeconfig=kubeconfig,
            cycle_interval_s=0.05,
        )

        async def admitted_events(name: str) -> int:
            listed = await asyncio.to_thread(kube.core.list_namespaced_event, NS)
            return sum(1 for e in listed.items if e.involved_object.name == name and e.reason == "Admitted")

        async with serving(settings) as url, httpx.AsyncClient(base_url=url) as http:
            assert (await http.put("/v1/config", json=QUEUES)).status_code == 200
            await asyncio.to_thread(
                webhooks.create_mutating_webhook_configuration, webhook_configuration(url)
            )
            for jobset in (first, second):
                await asyncio.to_thread(
                    kube.custom.create_namespaced_custom_object, *JOBSET, NS, "jobsets", jobset
                )
            await eventually(lambda: _false(kube.suspended("llama-pretrain")), what="the first admitted")

            async def second_waits() -> bool:
                job_id = (await kube.jobset("second"))["metadata"]["labels"]["tessera.io/job-id"]
                return (await http.get(f"/v1/jobs/{job_id}")).json().get("state") == "queued"

            await eventually(second_waits, what="the second queued over quota")
            await eventually(
                lambda: _equal(admitted_events("llama-pretrain"), 1), what="the first's Admitted Event"
            )
        await asyncio.to_thread(webhooks.delete_mutating_webhook_configuration, "tessera-admission")

        # Restarted on the same tables and cluster: the first runs on, the second still waits.
        async with serving(settings) as url, httpx.AsyncClient(base_url=url) as http:
            await asyncio.to_thread(
                webhooks.create_mutating_webhook_configuration, webhook_configuration(url)
            )
            await eventually(second_waits, what="the second still queued after the restart")
            listed = (await http.get("/v1/jobs")).json()
            assert len(listed) == 2, "each JobSet adopted once"
            assert await kube.suspended("llama-pretrain") is False and await kube.suspended("second") is True
            assert await admitted_events("llama-pretrain") == 1, "the running JobSet is not unsuspended again"

            # Deleting the first admits the second, once.
            await asyncio.to_thread(
                kube.custom.delete_namespaced_custom_object, *JOBSET, NS, "jobsets", "llama-pretrain"
            )
            await eventually(lambda: _false(kube.suspended("second")), what="the second admitted")
            await eventually(lambda: _equal(admitted_events("second"), 1), what="the second's Admitted Event")


async def _false(probe: Any) -> bool:
    return await probe is False


async def _equal(probe: Any, expected: Any) -> bool:
    return bool(await probe == expected)
