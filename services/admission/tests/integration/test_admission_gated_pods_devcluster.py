"""Pods labelled `tessera.io/queue` (a Deployment's, and a plain Pod) are held by the scheduling gate
`tessera.io/admission` and admitted one by one against their namespace's quota, with admission,
the scheduler and telemetry running on the devcluster and everything driven through the official
client: of a Deployment of 3 half-GPU pods with quota for 2, two are bound and one stays gated and
says why; a replica added by scaling queues too; deleting a bound pod admits the oldest gated one,
scaling down cancels the surplus' jobs, deleting the Deployment admits a plain labelled Pod; an
unlabelled Deployment's pods are left as they are."""

from __future__ import annotations

import asyncio
import contextlib
import json
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
from tessera.telemetry import bootstrap as telemetry
from tessera.telemetry.config import TelemetrySettings
from tessera.testing.services import eventually, reset_jetstream, running, settings_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[4]
CLUSTER_FILE = ROOT / "examples" / "clusters" / "dev-4x8.yaml"
EXAMPLE = ROOT / "examples" / "k8s" / "inference-deployment.yaml"
IMAGE = "vllm/vllm-openai:v0.6.4"
NS = "ml"
GATE = "tessera.io/admission"
QUEUES = {
    "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}],
    "queues": [{"name": "serving", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu-milli": 1000}}]}],
    "tenant_queues": [{"tenant": NS, "queue": "serving"}],
}


class Admission:
    """Admission served over HTTP (the API server calls its webhook), which a test may restart on
    the same port."""

    def __init__(self, settings: AdmissionSettings) -> None:
        self.settings = settings
        self.port = 0
        self.server: uvicorn.Server | None = None
        self.task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = create_app(build(self.settings), self.settings)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        server = self.server = uvicorn.Server(config)
        self.task = asyncio.create_task(server.serve())
        await eventually(lambda: _started(server), what="admission serving HTTP")
        self.port = server.servers[0].sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None and self.task is not None:
            self.server.should_exit = True
            await self.task
            self.server = self.task = None


@contextlib.asynccontextmanager
async def stack(
    nats_url: str, database: str, tmp_path: Path
) -> AsyncIterator[tuple[k8s.ApiClient, str, Admission]]:
    """The devcluster with telemetry, the scheduler and admission (its webhook registered); yields
    the API client, admission's URL and admission."""
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate_all, database)
    with DevCluster.from_file(CLUSTER_FILE, speed=20.0) as cluster:
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        t_settings = settings_for(TelemetrySettings, nats_url, database, cluster_file=CLUSTER_FILE)
        s_settings = settings_for(SchedulerSettings, nats_url, database, kubeconfig=kubeconfig, poll_s=0.2)
        a_settings = settings_for(
            AdmissionSettings,
            nats_url,
            database,
            auth="disabled",
            kubeconfig=kubeconfig,
            cycle_interval_s=0.05,
            workload_sync_interval_s=0.2,
        )
        admission = Admission(a_settings)
        async with (
            running(telemetry.build(t_settings), t_settings),
            running(scheduler.build(s_settings), s_settings),
        ):
            await admission.start()
            try:
                api = api_client(kubeconfig=str(kubeconfig))
                registrations = k8s.AdmissionregistrationV1Api(api)
                await asyncio.to_thread(
                    registrations.create_mutating_webhook_configuration, webhook_configuration(admission.url)
                )
                await asyncio.to_thread(k8s.CoreV1Api(api).create_namespace, {"metadata": {"name": NS}})
                yield api, admission.url, admission
            finally:
                await admission.stop()


async def _started(server: uvicorn.Server) -> bool:
    return server.started


def deployment(name: str, replicas: int, labelled: bool = True) -> dict[str, Any]:
    labels = {"app": name, **({"tessera.io/queue": "serving"} if labelled else {})}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels, "annotations": {"tessera.io/gpu-milli": "500"}},
                "spec": {
                    "containers": [
                        {"name": "vllm", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                    ]
                },
            },
        },
    }


def gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == GATE for g in pod["spec"].get("schedulingGates") or [])


class Cluster:
    """What the test reads through the official client, as JSON."""

    def __init__(self, api: k8s.ApiClient, http: httpx.AsyncClient, namespace: str = NS) -> None:
        self.core, self.apps, self.http = k8s.CoreV1Api(api), k8s.AppsV1Api(api), http
        self.ns = namespace

    async def pods(self, app: str) -> list[dict[str, Any]]:
        answer = await asyncio.to_thread(
            self.core.list_namespaced_pod, self.ns, label_selector=f"app={app}", _preload_content=False
        )
        items: list[dict[str, Any]] = json.loads(answer.data)["items"]
        return items

    async def split(self, app: str, bound: int, waiting: int) -> tuple[list[dict[str, Any]], ...] | None:
        """(bound pods, gated pods) once there are exactly so many of each."""
        pods = await self.pods(app)
        on_nodes = [p for p in pods if p["spec"].get("nodeName") and not gated(p)]
        held = [p for p in pods if gated(p) and not p["spec"].get("nodeName")]
        if len(on_nodes) == bound and len(held) == waiting and len(pods) == bound + waiting:
            return on_nodes, held
        return None

    async def job(self, pod: dict[str, Any]) -> dict[str, Any]:
        job_id = pod["metadata"]["labels"]["tessera.io/job-id"]
        return dict((await self.http.get(f"/v1/jobs/{job_id}")).json())

    async def reason(self, name: str, settled: bool = False) -> dict[str, Any] | None:
        """The pod's QuotaReserved condition once admission wrote it (with ``settled``, once a cycle
        said why: a pod's first condition may be `Pending`, waiting for the next cycle)."""
        found = await asyncio.to_thread(
            self.core.read_namespaced_pod_status, name, self.ns, _preload_content=False
        )
        conditions = json.loads(found.data)["status"].get("conditions") or []
        condition = next((c for c in conditions if c["type"] == "QuotaReserved"), None)
        if condition is None or (settled and condition.get("reason") == "Pending"):
            return None
        return dict(condition)

    async def queued_job(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        """The pod's job once admission adopted it and queued it."""
        job = await self.job(pod)
        return job if job.get("state") == "queued" else None

    async def events(self, name: str) -> list[tuple[str, str]]:
        listed = await asyncio.to_thread(self.core.list_namespaced_event, self.ns)
        return [(e.reason, e.message) for e in listed.items if e.involved_object.name == name]

    async def scale(self, name: str, replicas: int) -> None:
        await asyncio.to_thread(
            self.apps.patch_namespaced_deployment_scale, name, self.ns, {"spec": {"replicas": replicas}}
        )


async def test_a_deployment_s_pods_are_gated_and_admitted_one_by_one_against_quota(
    nats_url: str, fresh_database: str, tmp_path: Path
) -> None:
    async with (
        stack(nats_url, fresh_database, tmp_path) as (api, url, _),
        httpx.AsyncClient(base_url=url) as http,
    ):
        assert (await http.put("/v1/config", json=QUEUES)).status_code == 200
        cluster = Cluster(api, http)
        await asyncio.to_thread(cluster.apps.create_namespaced_deployment, NS, deployment("serve", 3))

        bound, (waiting,) = await eventually(
            lambda: cluster.split("serve", 2, 1), what="2 pods bound, 1 gated", timeout=60
        )
        assert {p["spec"]["schedulerName"] for p in [*bound, waiting]} == {"tessera"}
        assert {(await cluster.job(p))["state"] for p in bound} <= {"admitted", "placed", "running"}
        job = await eventually(lambda: cluster.queued_job(waiting), what="the gated pod's job queued")
        assert (job["tenant"], job["queue"], job["state"]) == (NS, "serving", "queued")
        condition = await eventually(
            lambda: cluster.reason(waiting["metadata"]["name"], settled=True), what="its reason"
        )
        assert condition["status"] == "False" and condition["reason"] == "QuotaExhausted"
        assert "queue serving" in condition["message"], condition
        events = await cluster.events(waiting["metadata"]["name"])
        assert "Queued" in [reason for reason, _ in events], events

        # An added replica queues too.
        await cluster.scale("serve", 4)
        bound, held = await eventually(lambda: cluster.split("serve", 2, 2), what="the new replica gated")
        for pod in held:
            await eventually(lambda pod=pod: _state(cluster, pod, "queued"), what="a gated pod's job queued")

        # Deleting a bound pod frees its quota: the oldest gated pod is admitted and bound, and the
        # ReplicaSet's replacement is gated.
        gone = bound[0]
        await asyncio.to_thread(cluster.core.delete_namespaced_pod, gone["metadata"]["name"], NS)
        await eventually(lambda: _ended(cluster, gone), what="the deleted pod's job ended")

        async def first_bound() -> bool:
            pods = {p["metadata"]["name"]: p for p in await cluster.pods("serve")}
            now = pods.get(waiting["metadata"]["name"])
            return bool(now and now["spec"].get("nodeName") and not gated(now))

        await eventually(first_bound, what="the first gated pod admitted and bound", timeout=60)
        bound, held = await eventually(lambda: cluster.split("serve", 2, 2), what="2 bound, 2 gated")
        assert "Admitted" in [reason for reason, _ in await cluster.events(waiting["metadata"]["name"])]

        # Scaling down removes the gated ones first; their jobs are cancelled.
        await cluster.scale("serve", 2)
        await eventually(lambda: cluster.split("serve", 2, 0), what="2 bound, none gated")
        for pod in held:
            await eventually(
                lambda pod=pod: _state(cluster, pod, "cancelled"), what="a removed pod's job cancelled"
            )

        # A plain labelled Pod waits for quota, and is admitted when the Deployment is deleted.
        solo = deployment("solo", 1)["spec"]["template"]
        solo["metadata"]["name"] = "solo"
        await asyncio.to_thread(cluster.core.create_namespaced_pod, NS, solo)
        await eventually(lambda: cluster.split("solo", 0, 1), what="the plain pod gated")
        (pod,) = await cluster.pods("solo")
        await eventually(lambda: _waits(cluster, pod), what="the plain pod's job waiting for quota")
        await asyncio.to_thread(cluster.apps.delete_namespaced_deployment, "serve", NS)
        await eventually(lambda: cluster.split("solo", 1, 0), what="the plain pod bound", timeout=60)

        # An unlabelled Deployment's pods are not Tessera's.
        await asyncio.to_thread(cluster.apps.create_namespaced_deployment, NS, deployment("free", 2, False))
        free = await eventually(lambda: _count(cluster.pods("free"), 2), what="the unlabelled pods")
        for pod in free:
            assert not gated(pod) and pod["spec"]["schedulerName"] == "default-scheduler"
            assert "tessera.io/job-id" not in pod["metadata"]["labels"]


async def _state(cluster: Cluster, pod: dict[str, Any], state: str) -> bool:
    return (await cluster.job(pod)).get("state") == state


async def _ended(cluster: Cluster, pod: dict[str, Any]) -> bool:
    """Cancelled by admission, or failed when the scheduler reported its pod gone first."""
    return (await cluster.job(pod)).get("state") in ("cancelled", "failed")


async def _waits(cluster: Cluster, pod: dict[str, Any]) -> bool:
    job = await cluster.job(pod)
    return job.get("state") == "queued" and bool(job.get("waiting"))


async def _count(probe: Any, n: int) -> list[dict[str, Any]] | None:
    found: list[dict[str, Any]] = await probe
    return found if len(found) == n else None


async def test_the_inference_example_applies_as_written_and_queues_replicas_over_quota(
    nats_url: str, fresh_database: str, tmp_path: Path
) -> None:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    namespace = manifest["metadata"]["namespace"]
    queues = yaml.safe_load((ROOT / "examples" / "queues" / "queues.yaml").read_text())
    async with (
        stack(nats_url, fresh_database, tmp_path) as (api, url, _),
        httpx.AsyncClient(base_url=url) as http,
    ):
        assert (await http.put("/v1/config", json=queues)).status_code == 200
        core, apps = k8s.CoreV1Api(api), k8s.AppsV1Api(api)
        await asyncio.to_thread(core.create_namespace, {"metadata": {"name": namespace}})
        await asyncio.to_thread(apps.create_namespaced_deployment, namespace, manifest)
        cluster = Cluster(api, http, namespace)
        app = manifest["metadata"]["name"]
        bound, _ = await eventually(
            lambda: cluster.split(app, 3, 0), what="3 half-GPU pods bound", timeout=60
        )
        assert {p["spec"]["containers"][0]["image"] for p in bound} == {"vllm/vllm-openai:v0.6.4"}
        assert len({p["metadata"]["labels"]["tessera.io/job-id"] for p in bound}) == 3
        job = await cluster.job(bound[0])
        assert (job["tenant"], job["queue"]) == (namespace, "inference")

        # The queue holds 2000 milli-GPUs: a fifth half-GPU replica waits, gated, and says why.
        await cluster.scale(app, 5)
        _, (waiting,) = await eventually(
            lambda: cluster.split(app, 4, 1), what="4 bound, 1 gated", timeout=60
        )
        condition = await eventually(
            lambda: cluster.reason(waiting["metadata"]["name"], settled=True), what="its reason"
        )
        assert condition["status"] == "False" and "queue inference" in condition["message"], condition


async def test_a_preempted_pod_is_deleted_and_comes_back_gated_to_queue_again(
    nats_url: str, fresh_database: str, tmp_path: Path
) -> None:
    queues = {
        **QUEUES,
        "queues": [{**QUEUES["queues"][0], "preemption": {"within_queue": "lower-priority"}}],
    }
    async with (
        stack(nats_url, fresh_database, tmp_path) as (api, url, _),
        httpx.AsyncClient(base_url=url) as http,
    ):
        assert (await http.put("/v1/config", json=queues)).status_code == 200
        scheduling = k8s.SchedulingV1Api(api)
        for name, value in (("batch-low", 10), ("serving-high", 1000)):
            body = {"metadata": {"name": name}, "value": value}
            await asyncio.to_thread(scheduling.create_priority_class, body)
        cluster = Cluster(api, http)
        low = deployment("low", 2)
        low["spec"]["template"]["spec"]["priorityClassName"] = "batch-low"
        await asyncio.to_thread(cluster.apps.create_namespaced_deployment, NS, low)
        before, _ = await eventually(
            lambda: cluster.split("low", 2, 0), what="both low pods bound", timeout=60
        )
        assert {(await cluster.job(p))["priority"] for p in before} == {10}

        urgent = deployment("urgent", 1)["spec"]["template"]
        urgent["metadata"]["name"] = "urgent"
        urgent["spec"]["priorityClassName"] = "serving-high"
        await asyncio.to_thread(cluster.core.create_namespaced_pod, NS, urgent)

        # The urgent pod takes a low one's quota: that pod is deleted, its ReplicaSet makes it again
        # gated, and the new pod queues.
        await eventually(lambda: cluster.split("urgent", 1, 0), what="the urgent pod bound", timeout=90)
        after, (again,) = await eventually(lambda: cluster.split("low", 1, 1), what="a low pod gated again")
        names = {p["metadata"]["name"] for p in before}
        assert again["metadata"]["name"] not in names and after[0]["metadata"]["name"] in names
        victim = next(p for p in before if p["metadata"]["name"] != after[0]["metadata"]["name"])
        assert (await cluster.job(victim))["state"] in ("preempted", "cancelled", "failed")
        await eventually(lambda: _waits(cluster, again), what="the recreated pod waiting for quota")


async def test_admission_restarted_mid_way_adopts_none_twice_and_loses_none(
    nats_url: str, fresh_database: str, tmp_path: Path
) -> None:
    async with (
        stack(nats_url, fresh_database, tmp_path) as (api, url, admission),
        httpx.AsyncClient(base_url=url) as http,
    ):
        assert (await http.put("/v1/config", json=QUEUES)).status_code == 200
        cluster = Cluster(api, http)
        await asyncio.to_thread(cluster.apps.create_namespaced_deployment, NS, deployment("serve", 3))
        bound, (waiting,) = await eventually(
            lambda: cluster.split("serve", 2, 1), what="2 bound, 1 gated", timeout=60
        )
        await eventually(lambda: _waits(cluster, waiting), what="the gated pod's job waiting")

        # Admission stops; meanwhile a bound pod is deleted (its replacement cannot be created while
        # the webhook does not answer: failurePolicy Fail).
        await admission.stop()
        await asyncio.to_thread(cluster.core.delete_namespaced_pod, bound[0]["metadata"]["name"], NS)
        await admission.start()

        # Back, it cancels the deleted pod's job, admits the gated pod, and the replacement queues.
        await eventually(lambda: _ended(cluster, bound[0]), what="the deleted pod's job ended")
        now, held = await eventually(
            lambda: cluster.split("serve", 2, 1), what="2 bound, 1 gated", timeout=60
        )
        assert waiting["metadata"]["name"] in {p["metadata"]["name"] for p in now}
        assert bound[1]["metadata"]["name"] in {p["metadata"]["name"] for p in now}
        await eventually(lambda: _waits(cluster, held[0]), what="the replacement's job waiting")
        listed = (await http.get("/v1/jobs", params={"tenant": NS})).json()
        ids = [job["id"] for job in listed]
        assert len(ids) == len(set(ids)) == 4, listed  # one job per pod ever made, none adopted twice
        admitted = [(await cluster.job(p)) for p in now]
        assert {job["state"] for job in admitted} <= {"admitted", "placed", "running"}
