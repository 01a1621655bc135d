"""LeaderWorkerSets whose pod templates carry `tessera.io/queue`, applied with the official client on the
devcluster with admission, the scheduler and telemetry running: each group (a leader and its
workers) is one Tessera job, admitted whole against the namespace's quota, its pods released and
bound together; a group added by scaling waits, gated, over quota and says why; deleting the
LeaderWorkerSet cancels its groups' jobs and frees the quota for the next; a preempted group's pods
are deleted and the group comes back gated as a new job; admission restarted mid-way submits no group
twice. The example applies as written."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client as k8s

from tessera.testing.services import eventually

from .test_admission_gated_pods_devcluster import ROOT, gated, stack

pytestmark = pytest.mark.integration

EXAMPLE = ROOT / "examples" / "k8s" / "lws-inference.yaml"
LWS = ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")
NS = "ml"
IMAGE = "vllm/vllm-openai:v0.6.4"
P = "leaderworkerset.sigs.k8s.io/"
QUEUES = {
    "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}],
    "queues": [{"name": "serving", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 2}}]}],
    "tenant_queues": [{"tenant": NS, "queue": "serving"}],
}


def template(role: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "llm", "role": role, "tessera.io/queue": "serving"}},
        "spec": {
            "containers": [{"name": role, "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        },
    }


def lws(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{LWS[0]}/{LWS[1]}",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {
                "size": 2,
                "leaderTemplate": template("leader"),
                "workerTemplate": template("worker"),
            },
        },
    }


class Cluster:
    def __init__(self, api: k8s.ApiClient, http: httpx.AsyncClient, namespace: str = NS) -> None:
        self.core, self.objects, self.http, self.ns = (
            k8s.CoreV1Api(api),
            k8s.CustomObjectsApi(api),
            http,
            namespace,
        )

    async def pods(self, name: str) -> list[dict[str, Any]]:
        answer = await asyncio.to_thread(
            self.core.list_namespaced_pod, self.ns, label_selector=f"{P}name={name}", _preload_content=False
        )
        items: list[dict[str, Any]] = json.loads(answer.data)["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    async def groups(self, name: str, bound: int, waiting: int) -> dict[str, list[dict[str, Any]]] | None:
        """group index -> pods, once exactly ``bound`` groups are bound whole and ``waiting`` gated."""
        by_group: dict[str, list[dict[str, Any]]] = {}
        for pod in await self.pods(name):
            by_group.setdefault(pod["metadata"]["labels"].get(f"{P}group-index", ""), []).append(pod)
        placed = [g for g in by_group.values() if len(g) == 2 and all(_on_node(p) for p in g)]
        held = [g for g in by_group.values() if len(g) == 2 and all(gated(p) for p in g)]
        if (len(placed), len(held), len(by_group)) == (bound, waiting, bound + waiting):
            return by_group
        return None

    async def job(self, job_id: str) -> dict[str, Any]:
        return dict((await self.http.get(f"/v1/jobs/{job_id}")).json())

    async def jobs(self) -> list[dict[str, Any]]:
        return list((await self.http.get("/v1/jobs", params={"tenant": self.ns})).json())

    async def events(self, name: str) -> list[tuple[str, str]]:
        listed = await asyncio.to_thread(self.core.list_namespaced_event, self.ns)
        return [(e.reason, e.message) for e in listed.items if e.involved_object.name == name]

    async def create(self, body: dict[str, Any]) -> None:
        await asyncio.to_thread(
            self.objects.create_namespaced_custom_object, LWS[0], LWS[1], self.ns, LWS[2], body
        )


def _on_node(pod: dict[str, Any]) -> bool:
    return bool(pod["spec"].get("nodeName")) and not gated(pod)


async def _job_state(cluster: Cluster, job_id: str, *states: str) -> dict[str, Any] | None:
    job = await cluster.job(job_id)
    return job if job.get("state") in states else None


async def test_each_group_is_admitted_whole_a_scaled_group_waits_and_deletion_frees_the_quota(
    nats_url: str, fresh_database: str, tmp_path: Path
) -> None:
    async with (
        stack(nats_url, fresh_database, tmp_path) as (api, url, _),
        httpx.AsyncClient(base_url=url) as http,
    ):
        assert (await http.put("/v1/config", json=QUEUES)).status_code == 200
        cluster = Cluster(api, http)
        await cluster.create(lws("llm", 1))

        groups = await eventually(lambda: cluster.groups("llm", 1, 0), what="one group bound", timeout=60)
        (first,) = groups.values()
        ids = {p["metadata"]["labels"]["tessera.io/job-id"] for p in first}
        assert len(ids) == 1, first  # the leader and its worker: one job, one gang
        (first_id,) = ids
        assert {p["metadata"]["labels"]["tessera.io/pod-group-name"] for p in first} == {"leader", "workers"}
        assert {p["spec"]["schedulerName"] for p in first} == {"tessera"}
        job = await cluster.job(first_id)
        assert (job["tenant"], job["queue"], job["state"]) in {
            (NS, "serving", s) for s in ("admitted", "placed", "running")
        }
        assert [(g["name"], g["replicas"]) for g in job["spec"]["pod_groups"]] == [
            ("leader", 1),
            ("workers", 1),
        ]

        # Scaled up, the new group queues: no quota is left for its 2 GPUs, so both its pods stay
        # gated (none of them is released alone) and its job says why.
        await asyncio.to_thread(
            cluster.objects.patch_namespaced_custom_object_scale,
            LWS[0],
            LWS[1],
            NS,
            LWS[2],
            "llm",
            {"spec": {"replicas": 2}},
        )
        groups = await eventually(lambda: cluster.groups("llm", 1, 1), what="the new group gated", timeout=60)

        async def second_job() -> dict[str, Any] | None:
            others = [j for j in await cluster.jobs() if j["id"] != first_id and j["state"] == "queued"]
            return others[0] if len(others) == 1 and others[0].get("waiting") else None

        waiting = await eventually(second_job, what="the second group's job waiting for quota")
        assert [(g["name"], g["replicas"]) for g in waiting["spec"]["pod_groups"]] == [
            ("leader", 1),
            ("workers", 1),
        ]
        held = next(g for g in groups.values() if all(gated(p) for p in g))
        assert all("tessera.io/job-id" not in p["metadata"]["labels"] for p in held)

        async def queued_and_admitted() -> list[str] | None:
            reasons = [reason for reason, _ in await cluster.events("llm")]
            return reasons if {"Queued", "Admitted"} <= set(reasons) else None

        await eventually(queued_and_admitted, what="llm's Queued and Admitted Events")

        async def says_why() -> list[str]:
            return [m for _, m in await cluster.events("llm") if "waits:" in m and "queue serving" in m]

        assert await eventually(says_why, what="an Event with the waiting group's reason")

        # Deleted, its groups' jobs are cancelled and their quota admits the next LeaderWorkerSet.
        await asyncio.to_thread(
            cluster.objects.delete_namespaced_custom_object, LWS[0], LWS[1], NS, LWS[2], "llm"
        )
        for job_id in (first_id, waiting["id"]):
            await eventually(
                lambda job_id=job_id: _job_state(cluster, job_id, "cancelled", "failed"),
                what="a deleted group's job ended",
            )
        await cluster.create(lws("next", 1))
        await eventually(lambda: cluster.groups("next", 1, 0), what="the next group bound", timeout=60)


async def test_the_lws_example_applies_as_written(nats_url: str, fresh_database: str, tmp_path: Path) -> None:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    queues = yaml.safe_load((ROOT / "examples" / "queues" / "queues.yaml").read_text())
    async with (
        stack(nats_url, fresh_database, tmp_path) as (api, url, _),
        httpx.AsyncClient(base_url=url) as http,
    ):
        assert (await http.put("/v1/config", json=queues)).status_code == 200
        await asyncio.to_thread(k8s.CoreV1Api(api).create_namespace, {"metadata": {"name": namespace}})
        cluster = Cluster(api, http, namespace)
        await cluster.create(manifest)
        groups = await eventually(lambda: cluster.groups(name, 2, 0), what="both groups bound", timeout=90)
        ids = {g: {p["metadata"]["labels"]["tessera.io/job-id"] for p in pods} for g, pods in groups.items()}
        assert all(len(v) == 1 for v in ids.values()) and len(set().union(*ids.values())) == 2, ids
        for pods in groups.values():
            assert {p["spec"]["containers"][0]["image"] for p in pods} == {IMAGE}
            job = await cluster.job(pods[0]["metadata"]["labels"]["tessera.io/job-id"])
            assert (job["tenant"], job["queue"]) == (namespace, "inference")


async def test_a_preempted_group_is_deleted_whole_and_comes_back_gated_as_a_new_job(
    nats_url: str, fresh_database: str, tmp_path: Path
) -> None:
    queues = {**QUEUES, "queues": [{**QUEUES["queues"][0], "preemption": {"within_queue": "lower-priority"}}]}
    async with (
        stack(nats_url, fresh_database, tmp_path) as (api, url, _),
        httpx.AsyncClient(base_url=url) as http,
    ):
        assert (await http.put("/v1/config", json=queues)).status_code == 200
        scheduling = k8s.SchedulingV1Api(api)
        for name, value in (("batch-low", 10), ("serving-high", 1000)):
            await asyncio.to_thread(
                scheduling.create_priority_class, {"metadata": {"name": name}, "value": value}
            )
        cluster = Cluster(api, http)
        low = lws("low", 1)
        low["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["priorityClassName"] = "batch-low"
        await cluster.create(low)
        (before,) = (
            await eventually(lambda: cluster.groups("low", 1, 0), what="the group bound", timeout=60)
        ).values()
        (first_id,) = {p["metadata"]["labels"]["tessera.io/job-id"] for p in before}
        assert (await cluster.job(first_id))["priority"] == 10

        urgent = template("leader")
        urgent["metadata"]["name"] = "urgent"
        urgent["spec"]["priorityClassName"] = "serving-high"
        urgent["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
        await asyncio.to_thread(cluster.core.create_namespaced_pod, NS, urgent)

        async def urgent_bound() -> bool:
            pod = await asyncio.to_thread(
                cluster.core.read_namespaced_pod, "urgent", NS, _preload_content=False
            )
            return _on_node(json.loads(pod.data))

        await eventually(urgent_bound, what="the urgent pod bound", timeout=90)
        (after,) = (
            await eventually(lambda: cluster.groups("low", 0, 1), what="the group gated again")
        ).values()
        assert {p["metadata"]["uid"] for p in after}.isdisjoint({p["metadata"]["uid"] for p in before})
        await eventually(
            lambda: _job_state(cluster, first_id, "preempted", "cancelled", "failed"), what="the old job over"
        )

        async def requeued() -> bool:
            return any(j["id"] != first_id and j["state"] == "queued" for j in await cluster.jobs())

        await eventually(requeued, what="the group made again queued as a new job")


async def test_admission_restarted_mid_way_submits_no_group_twice_and_keeps_the_admitted_one(
    nats_url: str, fresh_database: str, tmp_path: Path
) -> None:
    async with (
        stack(nats_url, fresh_database, tmp_path) as (api, url, admission),
        httpx.AsyncClient(base_url=url) as http,
    ):
        assert (await http.put("/v1/config", json=QUEUES)).status_code == 200
        cluster = Cluster(api, http)
        await cluster.create(lws("llm", 2))
        before = await eventually(
            lambda: cluster.groups("llm", 1, 1), what="1 group bound, 1 gated", timeout=60
        )

        async def two_jobs() -> list[dict[str, Any]] | None:
            jobs = await cluster.jobs()
            return (
                jobs
                if len(jobs) == 2 and any(j["state"] == "queued" and j.get("waiting") for j in jobs)
                else None
            )

        first = await eventually(two_jobs, what="both groups' jobs, one waiting")

        await admission.stop()
        await admission.start()

        # Back, it finds both groups' jobs under the same ids: none submitted again, the admitted
        # group left bound and the other still gated.
        after = await eventually(lambda: cluster.groups("llm", 1, 1), what="the same split")
        assert {p["metadata"]["uid"] for g in after.values() for p in g} == {
            p["metadata"]["uid"] for g in before.values() for p in g
        }
        await asyncio.sleep(1.0)  # a few of admission's rounds (every 0.2 s)
        again = await eventually(two_jobs, what="still two jobs")
        assert {j["id"] for j in again} == {j["id"] for j in first}
        waiting = {j["id"] for j in first if j["state"] == "queued"}
        assert {j["id"] for j in again if j["state"] == "queued"} == waiting
        assert {j["state"] for j in again if j["id"] not in waiting} <= {"admitted", "placed", "running"}


async def test_a_label_on_the_leaderworkerset_alone_queues_its_groups(
    nats_url: str, fresh_database: str, tmp_path: Path
) -> None:
    body = lws("labelled", 1)
    body["metadata"]["labels"] = {"tessera.io/queue": "serving"}
    for role in ("leaderTemplate", "workerTemplate"):  # the templates carry no queue label
        del body["spec"]["leaderWorkerTemplate"][role]["metadata"]["labels"]["tessera.io/queue"]
    async with (
        stack(nats_url, fresh_database, tmp_path) as (api, url, _),
        httpx.AsyncClient(base_url=url) as http,
    ):
        assert (await http.put("/v1/config", json=QUEUES)).status_code == 200
        cluster = Cluster(api, http)
        await cluster.create(body)
        groups = await eventually(
            lambda: cluster.groups("labelled", 1, 0), what="the group bound", timeout=90
        )
        (pods,) = groups.values()
        assert {p["metadata"]["labels"]["tessera.io/queue"] for p in pods} == {"serving"}
        (job_id,) = {p["metadata"]["labels"]["tessera.io/job-id"] for p in pods}
        assert (await cluster.job(job_id))["queue"] == "serving"
