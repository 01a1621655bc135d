"""Through the service: a gang that fits its quota but not the cluster's free shape waits as
NoFeasiblePlacement holding no quota, until placements and inventory change; and a victim that
never reports released is preempted at its deadline, which admits the preemptor (the victim queues again)."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.contracts import subjects
from tessera.contracts.events import (
    GangPlaced,
    GpuAssignment,
    GpuInventory,
    InventoryChanged,
    NodeInventory,
    PodPlacement,
    PreemptionRequested,
)
from tessera.core.messaging.envelope import encode
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.testing.services import eventually, read_stream

pytestmark = pytest.mark.integration


def queue_config(gpus: int, **timing: float) -> dict[str, Any]:
    return {
        "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}],
        "queues": [{"name": "team", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": gpus}}]}],
        "tenant_queues": [{"tenant": "t", "queue": "team"}],
        "priority_classes": [{"name": "low", "value": 0}, {"name": "high", "value": 100}],
        **({"preemption_timing": timing} if timing else {}),
    }


def gang(name: str, pods: int, gpus: int, priority_class: str = "low") -> dict[str, Any]:
    return {
        "name": name,
        "tenant": "t",
        "priority_class": priority_class,
        "pod_groups": [{"name": "w", "replicas": pods, "gpu": {"count": gpus}}],
    }


def node(name: str, gpus: int) -> NodeInventory:
    return NodeInventory(
        name=name,
        cpu_milli=64000,
        memory_mib=512000,
        gpus=[
            GpuInventory(index=i, uuid=f"{name}-gpu{i}", model="A100-80GB", memory_mib=81920)
            for i in range(gpus)
        ],
    )


async def publish(api: Any, owner: str, message: Any) -> None:
    await ensure_stream(api.ctx.js, owner, StreamLimits())
    subject, headers, body = encode(message, f"tessera/{owner}")
    await api.ctx.js.publish(subject, body, headers=headers)


async def job(api: Any, job_id: str) -> dict[str, Any]:
    body: dict[str, Any] = (await api.client.get(f"/v1/jobs/{job_id}")).json()
    return body


async def test_a_gang_the_free_shape_cannot_hold_waits_without_holding_quota(api: Any) -> None:
    assert (await api.client.put("/v1/config", json=queue_config(16))).status_code == 200
    await publish(api, "telemetry", InventoryChanged(source="test", nodes=[node("n1", 4), node("n2", 4)]))

    async def inventory_known() -> bool:
        return bool(await api.scalar("SELECT count(*) FROM admission.inventory_nodes") == 2)

    await eventually(inventory_known, what="admission's copy of the inventory")
    small = await api.client.post("/v1/jobs", json=gang("small", 1, 4), headers={"Idempotency-Key": "small"})
    big = await api.client.post("/v1/jobs", json=gang("big", 1, 8), headers={"Idempotency-Key": "big"})
    assert small.status_code == big.status_code == 201

    async def decided() -> bool:
        return (await job(api, "small"))["state"] == "admitted" and "NoFeasiblePlacement" in (
            (await job(api, "big"))["history"][-1]["reason"]
        )

    await eventually(decided, what="the 4-GPU job admitted and the 8-GPU gang waiting on shape")
    status = (await api.client.get("/v1/queues/team/status")).json()
    assert status["resources"][0]["usage"] == 4, "the waiting gang holds no quota"
    assert status["pending_jobs"] == [
        {
            "id": "big",
            "reason": "NoFeasiblePlacement",
            "message": "no node shape holds a pod of 'w' (8 GPUs): the largest node, n1, has 4 x A100-80GB",
        }
    ]

    # The scheduler places the small job on n1; then a node with 8 free GPUs joins.
    placed = GangPlaced(
        job_id="small",
        placements=[
            PodPlacement(
                pod="small-w-0",
                group="w",
                node="n1",
                gpus=[GpuAssignment(index=i, uuid=f"n1-gpu{i}", milli=1000) for i in range(4)],
            )
        ],
    )
    await publish(api, "scheduler", placed)
    await publish(
        api, "telemetry", InventoryChanged(source="test", nodes=[node("n1", 4), node("n2", 4), node("n3", 8)])
    )

    async def big_admitted() -> bool:
        return (await job(api, "big"))["state"] == "admitted"

    await eventually(big_admitted, what="the gang admitted once a node can hold it")

    async def small_placed() -> bool:
        return (await job(api, "small"))["state"] == "placed"

    await eventually(small_placed, what="the placement recorded")
    pods = await api.scalar(
        "SELECT jsonb_array_length(pods) FROM admission.placements WHERE job_id = 'small'"
    )
    assert pods == 1


async def test_a_victim_that_never_reports_released_is_preempted_at_its_deadline(api: Any) -> None:
    config = queue_config(4, default_grace_s=0.2, checkpoint_grace_s=0.2, release_timeout_s=0.3)
    assert (await api.client.put("/v1/config", json=config)).status_code == 200
    assert (
        await api.client.post("/v1/jobs", json=gang("low", 1, 4), headers={"Idempotency-Key": "low"})
    ).status_code == 201

    async def low_admitted() -> bool:
        return (await job(api, "low"))["state"] == "admitted"

    await eventually(low_admitted, what="the low-priority job admitted")
    high = await api.client.post(
        "/v1/jobs", json=gang("high", 1, 4, "high"), headers={"Idempotency-Key": "high"}
    )
    assert high.status_code == 201

    async def high_admitted() -> bool:
        return (await job(api, "high"))["state"] == "admitted"

    await eventually(high_admitted, what="the preemptor admitted at the deadline")
    victim = await job(api, "low")
    assert victim["state"] == "queued", "preempted, then queued again behind the preemptor"
    steps = [(step["state"], step["reason"]) for step in victim["history"]]
    released = steps.index(("preempted", "preempted by high (InQueuePriority): release deadline passed"))
    assert steps[released + 1] == ("queued", "requeued after preemption")
    requests = [e.parse() for e in await read_stream(api.ctx.js, subjects.PREEMPTION_REQUESTED)]
    assert [(r.victim_job_id, r.forced) for r in requests if isinstance(r, PreemptionRequested)] == [
        ("low", False),
        ("low", True),
    ]
