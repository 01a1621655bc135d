"""`kubectl describe job` answers "why is my job pending?": admission writes QuotaReserved, Admitted
and Inadmissible conditions into users' labelled Jobs' status (through the status subresource, the
Job controller's own conditions kept) with messages that carry the numbers, and an Event when the
reason changes. A Job naming a queue that does not exist is Inadmissible with reason QueueNotFound;
one whose pod no node's shape could ever hold is Inadmissible naming the shape; a Job's priority is
the value of the Kubernetes PriorityClass its template names. All through the official client
against the devcluster."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from kubernetes import client as k8s

from tessera.cluster.kube import api_client
from tessera.contracts.events import GpuInventory, InventoryChanged, NodeInventory
from tessera.core.messaging.envelope import encode
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.testing.services import eventually

from .test_admission_native_jobs_devcluster import kubeconfig, labelled_job, serving
from .test_admission_webhook_devcluster import register

pytestmark = pytest.mark.integration

__all__ = ["kubeconfig"]  # the fixture: a devcluster of 4 nodes of 8 A100-80GB GPUs

QUEUES = {
    "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}],
    "queues": [
        {"name": "team-a", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 4}}]},
        {"name": "big", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 64}}]},
    ],
    "tenant_queues": [{"tenant": "ml", "queue": "team-a"}, {"tenant": "bigco", "queue": "big"}],
}


async def publish_inventory(nats_url: str) -> None:
    """What telemetry publishes of the devcluster's four 8-GPU nodes."""
    nodes = [
        NodeInventory(
            name=f"gpu-node-{n}",
            cpu_milli=96000,
            memory_mib=1048576,
            gpus=[
                GpuInventory(index=i, uuid=f"gpu-node-{n}-{i}", model="A100-80GB", memory_mib=81920)
                for i in range(8)
            ],
        )
        for n in range(4)
    ]
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_stream(js, "telemetry", StreamLimits())
        subject, headers, body = encode(InventoryChanged(source="test", nodes=nodes), "tessera/telemetry")
        await js.publish(subject, body, headers=headers)
    finally:
        await nc.close()


async def _contains(found: Awaitable[list[Any]], item: Any) -> bool:
    return item in await found


async def test_a_jobs_conditions_and_events_say_why_it_waits_with_the_numbers(
    admission_db: tuple[str, str], kubeconfig: Path
) -> None:
    api = api_client(kubeconfig=str(kubeconfig))
    batch: Any = k8s.BatchV1Api(api)
    core: Any = k8s.CoreV1Api(api)
    for ns in ("ml", "bigco"):
        await asyncio.to_thread(core.create_namespace, {"metadata": {"name": ns}})

    async def conditions(name: str, ns: str = "ml") -> dict[str, tuple[str, str, str]]:
        found = await asyncio.to_thread(batch.read_namespaced_job_status, name, ns)
        return {c.type: (c.status, c.reason, c.message) for c in found.status.conditions or []}

    async def events(name: str, ns: str = "ml") -> list[tuple[str, str, str]]:
        """The Job's Events as `kubectl describe job` finds them: by the object's name and uid."""
        uid = (await asyncio.to_thread(batch.read_namespaced_job, name, ns)).metadata.uid
        selector = f"involvedObject.kind=Job,involvedObject.name={name},involvedObject.uid={uid}"
        listed = await asyncio.to_thread(core.list_namespaced_event, ns, field_selector=selector)
        return [(e.type, e.reason, e.message) for e in listed.items]

    async with serving(admission_db, kubeconfig) as url, httpx.AsyncClient(base_url=url) as http:
        assert (await http.put("/v1/config", json=QUEUES)).status_code == 200
        await publish_inventory(admission_db[0])
        await asyncio.to_thread(register, api, url)

        await asyncio.to_thread(batch.create_namespaced_job, "ml", labelled_job("first", "team-a"))

        async def admitted() -> dict[str, tuple[str, str, str]] | None:
            found = await conditions("first")
            return found if found.get("Admitted", ("",))[0] == "True" else None

        first = await eventually(admitted, what="first's Admitted condition", timeout=30)
        assert first["QuotaReserved"] == (
            "True",
            "QuotaReserved",
            "queue team-a: quota reserved in flavor a100-80gb",
        )
        assert first["Inadmissible"][0] == "False"

        # Over quota: the condition and an Event carry the numbers.
        await asyncio.to_thread(batch.create_namespaced_job, "ml", labelled_job("second", "team-a"))
        why = (
            "queue team-a: needs 4 A100-80GB GPUs, 0 free in quota, no cohort to borrow from; "
            "no preemptible victims"
        )

        async def reserved_no() -> tuple[str, str, str] | None:
            found = (await conditions("second")).get("QuotaReserved")
            return found if found and found[1] == "QuotaExhausted" else None

        assert await eventually(reserved_no, what="second's QuotaReserved=False", timeout=30) == (
            "False",
            "QuotaExhausted",
            why,
        )
        await eventually(  # the Event is written just after the condition
            lambda: _contains(events("second"), ("Normal", "QuotaExhausted", why)),
            what="second's QuotaExhausted Event",
            timeout=30,
        )
        assert (await conditions("second"))["Inadmissible"][0] == "False"
        assert (await asyncio.to_thread(batch.read_namespaced_job, "second", "ml")).spec.suspend is True

        # A queue that does not exist: Inadmissible, QueueNotFound, and the Job stays suspended.
        await asyncio.to_thread(batch.create_namespaced_job, "ml", labelled_job("lost", "nope"))

        async def inadmissible(name: str, ns: str = "ml") -> tuple[str, str, str] | None:
            found = (await conditions(name, ns)).get("Inadmissible")
            return found if found and found[0] == "True" else None

        lost = await eventually(lambda: inadmissible("lost"), what="lost Inadmissible", timeout=30)
        assert lost == ("True", "QueueNotFound", "queue: unknown queue 'nope'")
        warned = ("Warning", "QueueNotFound", "Inadmissible: queue: unknown queue 'nope'")
        await eventually(lambda: _contains(events("lost"), warned), what="lost's Warning Event", timeout=30)
        assert (await asyncio.to_thread(batch.read_namespaced_job, "lost", "ml")).spec.suspend is True

        # A pod no node could ever hold (16 GPUs; the nodes have 8): Inadmissible naming the shape.
        await asyncio.to_thread(batch.create_namespaced_job, "bigco", labelled_job("huge", "big", gpus=16))
        huge = await eventually(lambda: inadmissible("huge", "bigco"), what="huge Inadmissible", timeout=30)
        assert huge[1] == "NoFeasiblePlacement"
        assert "no node shape holds a pod of 'pods' (16 GPUs)" in huge[2] and "8 x A100-80GB" in huge[2], huge

        # The Job controller's own condition is kept beside admission's.
        assert (await conditions("second"))["Suspended"][0] == "True"

        # Priority from the Kubernetes PriorityClass the template names.
        scheduling: Any = k8s.SchedulingV1Api(api)
        high = {"metadata": {"name": "research-high"}, "value": 5000, "description": "urgent training"}
        await asyncio.to_thread(scheduling.create_priority_class, high)
        urgent = labelled_job("urgent", "team-a")
        urgent["spec"]["template"]["spec"]["priorityClassName"] = "research-high"
        await asyncio.to_thread(batch.create_namespaced_job, "ml", urgent)

        async def job_record(name: str) -> dict[str, Any] | None:
            found = await asyncio.to_thread(batch.read_namespaced_job, name, "ml")
            answer = await http.get(f"/v1/jobs/{found.metadata.labels['tessera.io/job-id']}")
            return dict(answer.json()) if answer.status_code == 200 else None

        record = await eventually(lambda: job_record("urgent"), what="urgent adopted", timeout=30)
        assert record["priority"] == 5000, record
