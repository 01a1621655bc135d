"""Issue 9 for every kind admission takes, not only batch/v1 Jobs: a JobSet and a plain Pod labelled
with a queue the configuration does not know are held (suspended, gated), carry the condition
`Inadmissible` with reason `QueueNotFound`, and a Warning Event says so; and a StatefulSet's pods,
labelled with a known queue in its template, are gated and admitted one by one against quota (two
replicas, quota for one: one bound, one gated saying why). Admission, the scheduler and telemetry run
on the devcluster; everything is read and written through the official client."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client as k8s

from tessera.testing.services import eventually

from .test_admission_gated_pods_devcluster import NS, QUEUES, Cluster, deployment, gated, stack

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[4]
JOBSET_EXAMPLE = ROOT / "examples" / "k8s" / "jobset-driver-workers.yaml"
GROUP, VERSION = "jobset.x-k8s.io", "v1alpha2"
NOWHERE = "nope"
WHY = f"queue: unknown queue {NOWHERE!r}"


def jobset_in(queue: str, name: str) -> dict[str, Any]:
    made: dict[str, Any] = copy.deepcopy(yaml.safe_load(JOBSET_EXAMPLE.read_text()))
    made["metadata"]["name"] = name
    made["metadata"]["labels"]["tessera.io/queue"] = queue
    return made


def statefulset(name: str, replicas: int) -> dict[str, Any]:
    """A StatefulSet of half-GPU pods whose template names the queue `serving` (its own labels do not)."""
    template = deployment(name, replicas)["spec"]["template"]
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": template,
        },
    }


async def warnings(core: Any, kind: str, name: str) -> list[tuple[Any, Any, Any]]:
    """The object's Events as `kubectl describe` finds them."""
    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    listed = await asyncio.to_thread(core.list_namespaced_event, NS, field_selector=selector)
    return [(e.type, e.reason, e.message) for e in listed.items]


async def pod_conditions(core: Any, name: str) -> dict[str, dict[str, Any]]:
    found = await asyncio.to_thread(core.read_namespaced_pod_status, name, NS, _preload_content=False)
    return {c["type"]: c for c in json.loads(found.data)["status"].get("conditions") or []}


async def test_a_jobset_and_a_pod_in_an_unknown_queue_are_held_inadmissible_and_say_so(
    nats_url: str, fresh_database: str, tmp_path: Path
) -> None:
    async with (
        stack(nats_url, fresh_database, tmp_path) as (api, url, _),
        httpx.AsyncClient(base_url=url) as http,
    ):
        assert (await http.put("/v1/config", json=QUEUES)).status_code == 200
        custom: Any = k8s.CustomObjectsApi(api)
        core: Any = k8s.CoreV1Api(api)
        cluster = Cluster(api, http)

        # A JobSet: suspended by the webhook, Inadmissible/QueueNotFound in its status, a Warning Event.
        await asyncio.to_thread(
            custom.create_namespaced_custom_object, GROUP, VERSION, NS, "jobsets", jobset_in(NOWHERE, "lost")
        )

        async def jobset_inadmissible() -> dict[str, Any] | None:
            found = await asyncio.to_thread(
                custom.get_namespaced_custom_object, GROUP, VERSION, NS, "jobsets", "lost"
            )
            conds = {c["type"]: c for c in (found.get("status") or {}).get("conditions") or []}
            cond = conds.get("Inadmissible")
            return dict(found) if cond is not None and cond["status"] == "True" else None

        lost = await eventually(jobset_inadmissible, what="the JobSet Inadmissible", timeout=30)
        conds = {c["type"]: c for c in lost["status"]["conditions"]}
        assert (conds["Inadmissible"]["reason"], conds["Inadmissible"]["message"]) == ("QueueNotFound", WHY)
        assert conds["QuotaReserved"]["status"] == "False" and conds["Admitted"]["status"] == "False"
        assert lost["spec"]["suspend"] is True
        assert ("Warning", "QueueNotFound", f"Inadmissible: {WHY}") in await warnings(core, "JobSet", "lost")
        job_id = lost["metadata"]["labels"]["tessera.io/job-id"]
        assert (await http.get(f"/v1/jobs/{job_id}")).json()["state"] == "rejected"

        # A plain Pod: gated (never bound), the same condition on the pod, and a Warning Event.
        pod = deployment("stray", 1)["spec"]["template"]
        pod["metadata"]["name"] = "stray"
        pod["metadata"]["labels"]["tessera.io/queue"] = NOWHERE
        await asyncio.to_thread(core.create_namespaced_pod, NS, pod)

        async def pod_inadmissible() -> dict[str, dict[str, Any]] | None:
            found = await pod_conditions(core, "stray")
            cond = found.get("Inadmissible")
            return found if cond is not None and cond["status"] == "True" else None

        stray = await eventually(pod_inadmissible, what="the Pod Inadmissible", timeout=30)
        assert (stray["Inadmissible"]["reason"], stray["Inadmissible"]["message"]) == ("QueueNotFound", WHY)
        assert stray["QuotaReserved"]["status"] == "False"
        assert ("Warning", "QueueNotFound", f"Inadmissible: {WHY}") in await warnings(core, "Pod", "stray")
        (held,) = await cluster.pods("stray")
        assert gated(held) and not held["spec"].get("nodeName")
        assert (await cluster.job(held))["state"] == "rejected"
        # The JobSet, rejected rounds before, is still held: nothing since has unsuspended it.
        found = await asyncio.to_thread(
            custom.get_namespaced_custom_object, GROUP, VERSION, NS, "jobsets", "lost"
        )
        assert found["spec"]["suspend"] is True


async def test_a_statefulset_s_pods_are_gated_and_admitted_one_by_one_against_quota(
    nats_url: str, fresh_database: str, tmp_path: Path
) -> None:
    half_a_gpu = [{"flavor": "a100-80gb", "resources": {"gpu-milli": 500}}]
    quota_for_one = {**QUEUES, "queues": [{"name": "serving", "quotas": half_a_gpu}]}
    async with (
        stack(nats_url, fresh_database, tmp_path) as (api, url, _),
        httpx.AsyncClient(base_url=url) as http,
    ):
        assert (await http.put("/v1/config", json=quota_for_one)).status_code == 200
        cluster = Cluster(api, http)
        apps: Any = cluster.apps
        await asyncio.to_thread(apps.create_namespaced_stateful_set, NS, statefulset("db", 2))

        # OrderedReady: db-0 is made, gated, admitted and bound; once it runs, db-1 is made and waits.
        (first,), (second,) = await eventually(
            lambda: cluster.split("db", 1, 1), what="db-0 bound, db-1 gated", timeout=60
        )
        assert (first["metadata"]["name"], second["metadata"]["name"]) == ("db-0", "db-1")
        assert {p["spec"]["schedulerName"] for p in (first, second)} == {"tessera"}
        assert [o["kind"] for o in second["metadata"]["ownerReferences"]] == ["StatefulSet"]
        assert (await cluster.job(first))["state"] in ("admitted", "placed", "running")

        async def adopted() -> dict[str, Any] | None:
            found = await cluster.job(second)
            return found if found.get("state") == "queued" else None

        job = await eventually(adopted, what="db-1 queued as a job", timeout=30)
        assert (job["tenant"], job["queue"], job["state"]) == (NS, "serving", "queued")

        async def quota_exhausted() -> dict[str, Any] | None:
            found = await cluster.reason("db-1")
            return found if found and found["reason"] == "QuotaExhausted" else None

        condition = await eventually(quota_exhausted, what="db-1's reason", timeout=30)
        assert condition["status"] == "False", condition
        assert "queue serving" in condition["message"], condition
        assert "Queued" in [reason for reason, _ in await cluster.events("db-1")]

        # Deleting db-0 frees its quota: db-1 is admitted and bound, and db-0, made again, waits gated.
        await asyncio.to_thread(cluster.core.delete_namespaced_pod, "db-0", NS)

        async def swapped() -> bool:
            pods = {p["metadata"]["name"]: p for p in await cluster.pods("db")}
            one, zero = pods.get("db-1"), pods.get("db-0")
            return bool(
                one
                and one["spec"].get("nodeName")
                and not gated(one)
                and zero
                and zero["metadata"]["uid"] != first["metadata"]["uid"]
                and gated(zero)
            )

        await eventually(swapped, what="db-1 bound, the new db-0 gated", timeout=60)
        assert "Admitted" in [reason for reason, _ in await cluster.events("db-1")]
