"""`tessera_admission_jobs{state}` counts admission's table by state, ended jobs included: a
cancelled job shows up there, where the cycle's queue gauges never look. The API's requests are
counted by route template, and the process metrics are on the same registry."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tessera.admission.domain.model import JobState
from tessera.testing.services import eventually

pytestmark = pytest.mark.integration


def job(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "tenant": "a",
        "pod_groups": [{"name": "worker", "replicas": 1, "gpu": {"count": 1}}],
    }


async def jobs_by_state(api: Any) -> dict[str, float]:
    response = await api.client.get("/metrics")
    assert response.status_code == 200, response.text
    return {
        sample.labels["state"]: sample.value
        for family in text_string_to_metric_families(response.text)
        if family.name == "tessera_admission_jobs"
        for sample in family.samples
    }


async def test_jobs_are_counted_by_state_from_the_table(api: Any) -> None:
    for name in ("m-1", "m-2", "m-3"):
        reply = await api.client.post("/v1/jobs", json=job(name), headers={"Idempotency-Key": name})
        assert reply.status_code == 201, reply.text
    cancelled = await api.client.post("/v1/jobs/m-3/cancel")
    assert cancelled.status_code == 200, cancelled.text

    async def as_the_table_says() -> dict[str, float] | None:
        got = await jobs_by_state(api)
        table: dict[str, int] = {}
        for listed in (await api.client.get("/v1/jobs")).json():
            table[listed["state"]] = table.get(listed["state"], 0) + 1
        same = got and all(got.get(state, 0) == table.get(state, 0) for state in {*got, *table})
        return got if same and table.get("cancelled") == 1 else None

    got = await eventually(as_the_table_says, timeout=30, what="the gauge to count the jobs by state")
    assert set(got) >= {state.value for state in JobState}  # every state, 0 when none is in it
    assert sum(got.values()) == 3 and got["cancelled"] == 1
    assert got["queued"] + got["admitted"] == 2


async def test_the_api_counts_its_requests_by_route_and_the_process_metrics_are_there(api: Any) -> None:
    for name in ("h-1", "h-2"):
        reply = await api.client.post("/v1/jobs", json=job(name), headers={"Idempotency-Key": name})
        assert reply.status_code == 201, reply.text
    assert (await api.client.get("/v1/jobs/h-1")).status_code == 200
    assert (await api.client.get("/v1/jobs/no-such-job")).status_code == 404
    response = await api.client.get("/metrics")
    got = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }

    def requests(method: str, route: str, status: int) -> float | None:
        labels = (("method", method), ("route", route), ("status", str(status)))
        return got.get(("tessera_http_requests_total", labels))

    assert requests("POST", "/v1/jobs", 201) == 2
    assert requests("GET", "/v1/jobs/{job_id}", 200) == 1
    assert requests("GET", "/v1/jobs/{job_id}", 404) == 1
    latency = ("tessera_http_request_duration_seconds_count", (("method", "POST"), ("route", "/v1/jobs")))
    assert got[latency] == 2
    assert got[("process_resident_memory_bytes", ())] > 0
