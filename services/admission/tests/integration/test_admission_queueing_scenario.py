"""Through the service: tenants A and B share a cohort of 16 GPUs, 8 nominal each. A fills all 16
by borrowing; B submits 8 GPUs of work; A's newest borrowed jobs are asked to leave, and B's jobs
are admitted once they report released. Events and job histories say why."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.contracts import subjects
from tessera.contracts.events import JobStateChanged, PreemptionRequested
from tessera.testing.services import eventually, read_stream

pytestmark = pytest.mark.integration

SHARED_COHORT = {
    "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}],
    "cohorts": [{"name": "shared"}],
    "queues": [
        {
            "name": f"team-{t}",
            "cohort": "shared",
            "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 8}}],
            "preemption": {"reclaim_within_cohort": "any", "within_queue": "lower-priority"},
        }
        for t in ("a", "b")
    ],
    "tenant_queues": [{"tenant": "a", "queue": "team-a"}, {"tenant": "b", "queue": "team-b"}],
}


def job(name: str, tenant: str, gpus: int = 4) -> dict[str, Any]:
    return {
        "name": name,
        "tenant": tenant,
        "pod_groups": [{"name": "worker", "replicas": 1, "gpu": {"count": gpus, "models": ["A100-80GB"]}}],
    }


async def submit(api: Any, job_id: str, spec: dict[str, Any]) -> None:
    response = await api.client.post("/v1/jobs", json=spec, headers={"Idempotency-Key": job_id})
    assert response.status_code == 201, response.text


async def states(api: Any, *ids: str) -> dict[str, str]:
    out = {}
    for job_id in ids:
        out[job_id] = (await api.client.get(f"/v1/jobs/{job_id}")).json()["state"]
    return out


async def test_borrowed_quota_is_reclaimed_by_preempting_the_newest_borrowers(api: Any) -> None:
    response = await api.client.put("/v1/config", json=SHARED_COHORT)
    assert response.status_code == 200, response.text
    a_jobs = [f"a-{i}" for i in range(1, 5)]
    for job_id in a_jobs:
        await submit(api, job_id, job(job_id, "a"))

    async def a_fills_the_cohort() -> bool:
        return set((await states(api, *a_jobs)).values()) == {"admitted"}

    await eventually(a_fills_the_cohort, what="A's 16 GPUs admitted, 8 of them borrowed")
    status = (await api.client.get("/v1/queues/team-a/status")).json()
    assert status["resources"] == [
        {"flavor": "a100-80gb", "resource": "gpu", "nominal": 8, "usage": 16, "borrowed": 8, "lent": 0}
    ]

    for job_id in ("b-1", "b-2"):
        await submit(api, job_id, job(job_id, "b"))

    async def preemptions() -> list[PreemptionRequested]:
        found = await read_stream(api.ctx.js, subjects.PREEMPTION_REQUESTED)
        parsed = [e.parse() for e in found]
        out = [p for p in parsed if isinstance(p, PreemptionRequested)]
        return out if len(out) >= 2 else []

    requested = await eventually(preemptions, what="two preemption requests")
    assert sorted(p.victim_job_id for p in requested) == ["a-3", "a-4"], "the newest borrowers go first"
    assert {p.preemptor_job_id for p in requested} == {"b-1", "b-2"}
    assert {p.reason for p in requested} == {"InCohortReclamation"}
    assert all(not p.forced and p.grace_period_s == 30 for p in requested)
    b_status = (await api.client.get("/v1/queues/team-b/status")).json()
    assert {j["reason"] for j in b_status["pending_jobs"]} == {"WaitingForVictims"}
    assert await states(api, "a-1", "a-2", "a-3", "a-4") == dict.fromkeys(a_jobs, "admitted")

    for victim in ("a-3", "a-4"):
        released = await api.client.post(f"/v1/jobs/{victim}/outcome", json={"state": "preempted"})
        assert released.status_code == 200, released.text

    async def b_admitted() -> bool:
        return set((await states(api, "b-1", "b-2")).values()) == {"admitted"}

    await eventually(b_admitted, what="B's jobs admitted after the victims released")
    # The victims queue again (A is back at its nominal quota, B uses its own: they wait for room).
    assert await states(api, *a_jobs) == {
        "a-1": "admitted",
        "a-2": "admitted",
        "a-3": "queued",
        "a-4": "queued",
    }

    victim = (await api.client.get("/v1/jobs/a-4")).json()
    steps = [(step["state"], step["reason"]) for step in victim["history"]]
    reasons = [reason for _, reason in steps]
    assert any(r.startswith("preemption requested by b-") and "InCohortReclamation" in r for r in reasons)
    released = next(i for i, (state, _) in enumerate(steps) if state == "preempted")
    assert reasons[released].startswith("released after preemption by b-")
    assert steps[released + 1] == ("queued", "requeued after preemption")
    preemptor = (await api.client.get("/v1/jobs/b-1")).json()
    steps = [(s["state"], s["reason"]) for s in preemptor["history"]]
    assert any(state == "queued" and "WaitingForVictims" in reason for state, reason in steps)
    assert steps[-1] == ("admitted", "admitted to queue team-b in flavor a100-80gb")

    async def lifecycle_events() -> list[JobStateChanged]:
        found = [e.parse() for e in await read_stream(api.ctx.js, subjects.JOB_STATE_CHANGED)]
        return [e for e in found if isinstance(e, JobStateChanged) and e.job_id == "a-4"]

    a4 = await eventually(lifecycle_events, what="a-4's lifecycle events")
    moves = [(e.previous_state, e.state) for e in a4 if e.previous_state != e.state]
    assert moves[-2:] == [("admitted", "preempted"), ("preempted", "queued")]
    b_usage = (await api.client.get("/v1/queues/team-b/status")).json()["resources"][0]
    assert (b_usage["usage"], b_usage["borrowed"]) == (8, 0)
