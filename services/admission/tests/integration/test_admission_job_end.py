"""The scheduler's `gang_finished` ends the job in admission: its final state, history and `job_finished`."""

from __future__ import annotations

import pytest

from tessera.contracts import subjects
from tessera.contracts.events import GangFinished, GangPlaced, GpuAssignment, PodPlacement
from tessera.core.messaging.envelope import encode
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.testing.services import eventually, read_stream

from .conftest import Api

pytestmark = pytest.mark.integration

JOB = {
    "name": "train",
    "tenant": "research",
    "pod_groups": [{"name": "worker", "replicas": 2, "gpu": {"count": 1}}],
}


async def state_of(api: Api, job_id: str) -> str:
    return str((await api.client.get(f"/v1/jobs/{job_id}")).json()["state"])


@pytest.mark.parametrize(("succeeded", "final"), [(True, "succeeded"), (False, "failed")])
async def test_a_finished_gang_ends_its_job_and_frees_its_quota(
    api: Api, succeeded: bool, final: str
) -> None:
    js = api.ctx.js
    await ensure_stream(js, "scheduler", StreamLimits())
    response = await api.client.post("/v1/jobs", json=JOB)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]

    async def admitted() -> bool:
        return await state_of(api, job_id) == "admitted"

    await eventually(admitted, what="the job to be admitted")
    pods = [
        PodPlacement(
            pod=f"train-worker-{i}",
            group="worker",
            node="n0",
            gpus=[GpuAssignment(index=i, uuid=f"GPU-{i}", milli=1000)],
        )
        for i in range(2)
    ]
    phases = {"train-worker-0": "Succeeded", "train-worker-1": "Succeeded" if succeeded else "Failed"}
    for event in (
        GangPlaced(job_id=job_id, placements=pods),
        GangFinished(job_id=job_id, succeeded=succeeded, pods=phases),
    ):
        subject, headers, body = encode(event, "tessera/scheduler")
        await js.publish(subject, body, headers=headers)

    async def ended() -> bool:
        return await state_of(api, job_id) == final

    await eventually(ended, what=f"the job to end {final}")
    history = (await api.client.get(f"/v1/jobs/{job_id}")).json()["history"]
    assert [h["state"] for h in history][-2:] == ["placed", final]
    assert "train-worker-1 " + phases["train-worker-1"] in history[-1]["reason"]
    assert await api.scalar("SELECT count(*) FROM admission.placements WHERE job_id = :j", j=job_id) == 0

    async def announced() -> list[str]:
        return [e.subject for e in await read_stream(js, subjects.JOB_FINISHED) if e.subject == job_id]

    assert await eventually(announced, what="job_finished") == [job_id]
