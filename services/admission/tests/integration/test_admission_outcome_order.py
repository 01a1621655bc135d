"""The scheduler's outcomes reach admission on two streams (`gang_placed` on the scheduler's, the
`running` report on admission's command subject), so admission may handle them in either order. Every
order ends in the job's true state, on real NATS and Postgres."""

from __future__ import annotations

import pytest

from tessera.contracts.events import (
    GangFinished,
    GangPlaced,
    GpuAssignment,
    Message,
    PodPlacement,
    ReportJobOutcome,
)
from tessera.core.messaging.envelope import encode
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.testing.services import eventually

from .conftest import Api

pytestmark = pytest.mark.integration

JOB = {
    "name": "train",
    "tenant": "research",
    "pod_groups": [{"name": "worker", "replicas": 2, "gpu": {"count": 1}}],
}


async def state_of(api: Api, job_id: str) -> str:
    return str((await api.client.get(f"/v1/jobs/{job_id}")).json()["state"])


async def admitted_job(api: Api) -> str:
    await ensure_stream(api.ctx.js, "scheduler", StreamLimits())
    response = await api.client.post("/v1/jobs", json=JOB)
    assert response.status_code == 201, response.text
    job_id = str(response.json()["id"])

    async def admitted() -> bool:
        return await state_of(api, job_id) == "admitted"

    await eventually(admitted, what="the job to be admitted")
    return job_id


def placed(job_id: str) -> GangPlaced:
    pods = [
        PodPlacement(
            pod=f"train-worker-{i}",
            group="worker",
            node="n0",
            gpus=[GpuAssignment(index=i, uuid=f"GPU-{i}", milli=1000)],
        )
        for i in range(2)
    ]
    return GangPlaced(job_id=job_id, placements=pods)


async def handled(api: Api, event: Message, source: str) -> None:
    """Publish ``event`` and wait until admission's consumer has handled it (its inbox holds its id)."""
    subject, headers, body = encode(event, source)
    await api.ctx.js.publish(subject, body, headers=headers)

    async def seen() -> bool:
        found = await api.scalar(
            "SELECT count(*) FROM admission.inbox WHERE message_id = :id", id=headers["Nats-Msg-Id"]
        )
        return bool(found)

    await eventually(seen, what=f"{event.TYPE} handled")


async def test_running_handled_before_gang_placed_leaves_the_job_running(api: Api) -> None:
    job_id = await admitted_job(api)
    await handled(
        api, ReportJobOutcome(job_id=job_id, state="running", reason="all 2 pods running"), "scheduler"
    )
    assert await state_of(api, job_id) == "running"
    await handled(api, placed(job_id), "tessera/scheduler")
    job = (await api.client.get(f"/v1/jobs/{job_id}")).json()
    assert job["state"] == "running", "a late gang_placed changes nothing"
    assert [h["state"] for h in job["history"]][-2:] == ["placed", "running"]
    assert "implied" in job["history"][-2]["reason"]
    pods = await api.scalar(
        "SELECT jsonb_array_length(pods) FROM admission.placements WHERE job_id = :j", j=job_id
    )
    assert pods == 2, "the late placement is still recorded: the running job holds those GPUs"


async def test_gang_finished_before_running_ends_the_job_and_a_late_running_is_a_no_op(api: Api) -> None:
    job_id = await admitted_job(api)
    await handled(api, placed(job_id), "tessera/scheduler")
    phases = {"train-worker-0": "Succeeded", "train-worker-1": "Succeeded"}
    await handled(api, GangFinished(job_id=job_id, succeeded=True, pods=phases), "tessera/scheduler")
    await handled(api, ReportJobOutcome(job_id=job_id, state="running"), "scheduler")
    job = (await api.client.get(f"/v1/jobs/{job_id}")).json()
    assert job["state"] == "succeeded"
    assert [h["state"] for h in job["history"]][-2:] == ["placed", "succeeded"]
    assert await api.scalar("SELECT count(*) FROM admission.placements WHERE job_id = :j", j=job_id) == 0
