"""Admission's metrics move with its cycles, read from the service's /metrics: a job admitted
leaves the queue-depth gauge and adds a latency sample; quota usage is shown against the nominal."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tessera.testing.services import eventually

pytestmark = pytest.mark.integration

ONE_QUEUE = {
    "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}],
    "queues": [{"name": "team-a", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 8}}]}],
    "tenant_queues": [{"tenant": "a", "queue": "team-a"}],
}
QUEUE = (("queue", "team-a"),)
GPU = (("flavor", "a100-80gb"), ("queue", "team-a"), ("resource", "gpu"))

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def job(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "tenant": "a",
        "pod_groups": [{"name": "worker", "replicas": 1, "gpu": {"count": 8, "models": ["A100-80GB"]}}],
    }


async def scrape(api: Any) -> Samples:
    response = await api.client.get("/metrics")
    assert response.status_code == 200, response.text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


async def submit(api: Any, job_id: str) -> None:
    response = await api.client.post("/v1/jobs", json=job(job_id), headers={"Idempotency-Key": job_id})
    assert response.status_code == 201, response.text


async def state(api: Any, job_id: str) -> str:
    return str((await api.client.get(f"/v1/jobs/{job_id}")).json()["state"])


async def test_an_admission_drops_the_queue_depth_and_adds_a_latency_sample(api: Any) -> None:
    response = await api.client.put("/v1/config", json=ONE_QUEUE)
    assert response.status_code == 200, response.text
    await submit(api, "a-1")
    await submit(api, "a-2")  # 8 GPUs more than the queue's 8: it waits

    async def one_in_one_waiting() -> Samples | None:
        got = await scrape(api)
        held = got.get(("tessera_admission_admitted_jobs", QUEUE))
        return got if held == 1 and got.get(("tessera_admission_pending_jobs", QUEUE)) == 1 else None

    got = await eventually(one_in_one_waiting, what="a-1 admitted, a-2 pending")
    assert {await state(api, "a-1"), await state(api, "a-2")} == {"admitted", "queued"}
    assert got[("tessera_admission_latency_seconds_count", ())] == 1
    assert got[("tessera_admission_quota_usage", GPU)] == 8
    assert got[("tessera_admission_quota_nominal", GPU)] == 8
    assert got[("tessera_admission_cycle_duration_seconds_count", ())] >= 1

    first = "a-1" if await state(api, "a-1") == "admitted" else "a-2"
    cancelled = await api.client.post(f"/v1/jobs/{first}/cancel")
    assert cancelled.status_code == 200, cancelled.text

    async def the_other_admitted() -> Samples | None:
        got = await scrape(api)
        return got if got.get(("tessera_admission_pending_jobs", QUEUE)) == 0 else None

    got = await eventually(the_other_admitted, what="the waiting job admitted")
    assert got[("tessera_admission_latency_seconds_count", ())] == 2
    assert got[("tessera_admission_admitted_jobs", QUEUE)] == 1
    assert got[("tessera_admission_quota_usage", GPU)] == 8
