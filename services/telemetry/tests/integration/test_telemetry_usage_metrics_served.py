"""The usage counters as the running telemetry service serves them on `/metrics`: two tenants' jobs,
named by admission's and the scheduler's events, read from the devcluster's NVML and PodResources,
show as GPU-hours allocated, used and idle and cost, labelled by tenant, queue and flavor."""

from __future__ import annotations

import httpx
import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tessera.contracts.events import GangPlaced, GpuAssignment, JobAccepted, PodPlacement
from tessera.core.messaging.envelope import encode
from tessera.core.messaging.streams import ensure_stream
from tessera.core.runner import create_app
from tessera.core.settings import StreamSettings
from tessera.devcluster.runner import DevCluster
from tessera.telemetry import bootstrap
from tessera.telemetry.config import TelemetrySettings
from tessera.testing.services import eventually, settings_for

from .test_telemetry_on_devcluster import devcluster, job_pod, system

pytestmark = pytest.mark.integration

__all__ = ["devcluster", "system"]  # the fixtures, used by name

COUNTERS = (
    "tessera_gpu_allocated_hours_total",
    "tessera_gpu_used_hours_total",
    "tessera_gpu_idle_hours_total",
    "tessera_gpu_cost_total",
)
JOBS = {  # job -> (pod, simulated profile, tenant, queue)
    "job-train": ("train-0", "training", "team-a", "research"),
    "job-sleepy": ("sleepy-0", "idle", "team-b", "serving"),
}


async def announce_and_place(nats_url: str, devcluster: DevCluster) -> None:
    """What admission and the scheduler would publish: each job's tenant and queue, and its pod's
    placement on the GPU the devcluster gave it."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    for owner in ("admission", "scheduler"):
        await ensure_stream(js, owner, StreamSettings().limits())
    inventory = {r.uuid: r.index for r in devcluster.nvml_readings("gpu-node-0")}
    with devcluster.ctx.lock:
        held = {key.split("/")[1]: d.holdings for key, d in devcluster.ctx.devices.items()}
    messages: list[JobAccepted | GangPlaced] = []
    for job_id, (pod, _, tenant, queue) in JOBS.items():
        messages.append(JobAccepted(job_id=job_id, name=pod, tenant=tenant, queue=queue))
        gpus = [GpuAssignment(index=inventory[h.gpu_uuid], uuid=h.gpu_uuid, milli=1000) for h in held[pod]]
        placement = PodPlacement(pod=pod, group="g", node="gpu-node-0", gpus=gpus)
        messages.append(GangPlaced(job_id=job_id, placements=[placement]))
    for message in messages:
        subject, headers, body = encode(message, "tessera/test")
        await js.publish(subject, body, headers=headers)
    await nc.close()


def usage_counters(exposition: str) -> dict[tuple[str, str, str, str], float]:
    """(counter, tenant, queue, flavor) -> value, from a Prometheus text exposition."""
    out: dict[tuple[str, str, str, str], float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name in COUNTERS:
                labels = sample.labels
                out[(sample.name, labels["tenant"], labels["queue"], labels["flavor"])] = sample.value
    return out


async def test_the_running_service_serves_gpu_hours_and_cost_by_tenant_queue_and_flavor(
    system: tuple[str, str], devcluster: DevCluster
) -> None:
    nats_url, db = system
    settings = settings_for(
        TelemetrySettings,
        nats_url,
        db,
        devcluster_url=devcluster.url,
        sample_interval_s=0.5,
        usage={"flush_interval_s": 0.5, "idle_window_s": 1.0},
        pricing={"flavors": [{"name": "a100", "gpu_model": "A100-80GB", "on_demand_per_gpu_hour": 4.0}]},
        auth="disabled",
    )
    async with httpx.AsyncClient() as http:
        for pod, profile, _, _ in JOBS.values():
            created = await http.post(
                f"{devcluster.url}/api/v1/namespaces/default/pods",
                json=job_pod(pod, "gpu-node-0", profile),
            )
            assert created.status_code == 201, created.text
    await announce_and_place(nats_url, devcluster)

    app = create_app(bootstrap.build(settings), settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://telemetry") as api,
    ):
        served: dict[tuple[str, str, str, str], float] = {}

        def value(counter: str, tenant: str, queue: str) -> float:
            return served.get((f"tessera_gpu_{counter}_total", tenant, queue, "a100"), 0.0)

        async def both_tenants_counted() -> bool:
            answer = await api.get("/metrics")
            assert answer.status_code == 200, answer.text
            served.clear()
            served.update(usage_counters(answer.text))
            return (
                value("allocated_hours", "team-a", "research") > 0
                and value("used_hours", "team-a", "research") > 0
                and value("cost", "team-a", "research") > 0
                and value("allocated_hours", "team-b", "serving") > 0
                and value("idle_hours", "team-b", "serving") > 0
                and value("cost", "team-b", "serving") > 0
            )

        try:
            await eventually(both_tenants_counted, what="both tenants' usage on /metrics", timeout=90)
        except AssertionError as timed_out:
            raise AssertionError(f"{timed_out}; usage counters at the end: {served}") from None
        # the trainer uses less than it holds; the sleeper holds its GPU idle
        assert value("used_hours", "team-a", "research") < value("allocated_hours", "team-a", "research")
        assert value("used_hours", "team-b", "serving") < value("idle_hours", "team-b", "serving")
        # nothing of either job is billed to the other's tenant and queue
        assert ("tessera_gpu_allocated_hours_total", "team-a", "serving", "a100") not in served
        assert ("tessera_gpu_allocated_hours_total", "team-b", "research", "a100") not in served
