"""Telemetry on real NATS and Postgres, reading the devcluster's simulated NVML over HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from prometheus_client import generate_latest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tessera.cluster.cluster_file import load_cluster
from tessera.contracts import subjects
from tessera.core.db.engine import async_url
from tessera.core.db.migrations import migrate_all
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.devcluster.sim.nvml import DutyCycleTrace
from tessera.telemetry import bootstrap
from tessera.telemetry.config import TelemetrySettings
from tessera.testing.services import eventually, read_stream, reset_jetstream, running, settings_for

pytestmark = pytest.mark.integration

CLUSTER = """
nodes:
  - name_prefix: gpu-node-
    count: 2
    cpu: "64"
    memory: 512Gi
    gpus: {count: 4, model: A100-80GB}
"""


@pytest.fixture
def devcluster(tmp_path: Path) -> Iterator[DevCluster]:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    cluster = DevCluster(
        load_cluster(tmp_path / "cluster.yaml"),
        settings=SimSettings(speed=10, pod_start_seconds=0.1),
        duty_cycle=DutyCycleTrace.synthetic(),
    )
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
async def system(nats_url: str, fresh_database: str) -> AsyncIterator[tuple[str, str]]:
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate_all, fresh_database)
    yield nats_url, fresh_database


async def events(nats_url: str, subject: str) -> list[dict[str, object]]:
    nc = await nats.connect(nats_url)
    try:
        return [e.data for e in await read_stream(nc.jetstream(), subject, idle_s=0.3)]
    finally:
        await nc.close()


async def sampling_rounds(nats_url: str, node: str) -> int:
    """How many sampling rounds telemetry has published for `node`: a round's samples share one time."""
    nc = await nats.connect(nats_url)
    try:
        samples = await read_stream(nc.jetstream(), subjects.gpu_samples(node), idle_s=0.2)
    finally:
        await nc.close()
    return len({sample.time for sample in samples})


async def after_more_rounds(nats_url: str, db: str, rounds: int, node: str = "gpu-node-1") -> None:
    """Return once telemetry has sampled `rounds` more times and published all it has stored.

    Each round publishes its samples and then stores what it observed (rollups, findings and their
    events, in one transaction), so when `rounds` more rounds have published their samples, the
    rounds before the last have stored theirs; once the outbox is empty, the relay has published them."""
    start = await sampling_rounds(nats_url, node)

    async def sampled() -> bool:
        return await sampling_rounds(nats_url, node) >= start + rounds

    async def outbox_drained() -> bool:
        return await scalar(db, "SELECT count(*) FROM telemetry.outbox") == 0

    await eventually(sampled, what=f"{rounds} more sampling rounds", timeout=20)
    await eventually(outbox_drained, what="the telemetry outbox to drain", timeout=20)


async def scalar(db: str, query: str) -> object:
    engine = create_async_engine(async_url(db))
    try:
        async with engine.connect() as conn:
            return (await conn.execute(text(query))).scalar_one()
    finally:
        await engine.dispose()


def pod(name: str, node: str, profile: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"tessera.io/sim-profile": profile}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "main",
                    "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


async def test_an_injected_xid_is_reported_once_within_15_seconds_and_not_again_after_a_restart(
    system: tuple[str, str], devcluster: DevCluster
) -> None:
    nats_url, db = system
    settings = settings_for(
        TelemetrySettings,
        nats_url,
        db,
        devcluster_url=devcluster.url,
        sample_interval_s=0.5,
        inventory_interval_s=1.0,
    )
    async with running(bootstrap.build(settings), settings), httpx.AsyncClient() as http:

        async def inventory_announced() -> bool:
            return bool(await events(nats_url, subjects.INVENTORY_CHANGED))

        await eventually(inventory_announced, what="the inventory", timeout=15)
        injected = time.monotonic()
        answer = await http.post(
            f"{devcluster.url}/faults/gpu-node-1", json={"kind": "xid", "gpu": 2, "code": 79}
        )
        assert answer.status_code == 200, answer.text

        async def unhealthy() -> list[dict[str, object]]:
            return await events(nats_url, subjects.GPU_UNHEALTHY)

        (event,) = await eventually(unhealthy, what="gpu_unhealthy", timeout=15)
        assert time.monotonic() - injected < 15
        assert (event["node"], event["gpu_index"], event["faults"], event["xid"]) == (
            "gpu-node-1",
            2,
            ["xid"],
            79,
        )
        gpu_uuid = devcluster.node("gpu-node-1").gpus[2].uuid
        assert event["gpu_uuid"] == gpu_uuid

        async def inventory_marks_it() -> bool:
            last = (await events(nats_url, subjects.INVENTORY_CHANGED))[-1]
            gpus = [g for n in last["nodes"] for g in n["gpus"]]  # type: ignore[attr-defined]
            return any(g["uuid"] == gpu_uuid and g["healthy"] is False for g in gpus)

        await eventually(inventory_marks_it, what="the inventory to mark the GPU unhealthy", timeout=10)
        await after_more_rounds(nats_url, db, 4)  # several more readings of the same fault
        assert len(await unhealthy()) == 1, "the fault must be reported once, not once per reading"
        assert (
            await scalar(
                db,
                "SELECT count(*) FROM telemetry.gpu_findings WHERE kind = 'unhealthy' AND ended_at IS NULL",
            )
            == 1
        )
        assert await scalar(db, f"SELECT healthy FROM telemetry.gpus WHERE uuid = '{gpu_uuid}'") is False

    # a restarted telemetry finds the open finding and does not report the same fault again
    async with running(bootstrap.build(settings), settings):
        await after_more_rounds(nats_url, db, 4)  # its first readings still carry the fault
        assert len(await unhealthy()) == 1


async def test_a_held_idle_gpu_is_reported_and_rollups_are_kept(
    system: tuple[str, str], devcluster: DevCluster
) -> None:
    nats_url, db = system
    settings = settings_for(
        TelemetrySettings,
        nats_url,
        db,
        devcluster_url=devcluster.url,
        sample_interval_s=0.5,
        idle={"idle_after_s": 1.0},
    )
    async with httpx.AsyncClient() as http:
        for name, profile in (("sleepy", "idle"), ("busy", "training")):
            created = await http.post(
                f"{devcluster.url}/api/v1/namespaces/default/pods", json=pod(name, "gpu-node-0", profile)
            )
            assert created.status_code == 201, created.text
    async with running(bootstrap.build(settings), settings) as service:

        async def idle() -> list[dict[str, object]]:
            return await events(nats_url, subjects.GPU_IDLE)

        (event,) = await eventually(idle, what="gpu_idle", timeout=15)
        assert event["pods"] == ["default/sleepy"] and event["node"] == "gpu-node-0"

        # the operations dashboard's allocation and utilisation: 2 of 8 GPUs held, the trainer's busy
        def gauges(name: str) -> list[float]:
            exposed = generate_latest(service.ctx.metrics.registry).decode().splitlines()
            return [float(line.rsplit(" ", 1)[1]) for line in exposed if line.startswith(name + "{")]

        held = gauges("tessera_gpu_held")
        assert len(held) == 8 and sum(held) == 2

        async def trainer_busy() -> bool:
            return max(gauges("tessera_gpu_utilization_percent")) > 50

        await eventually(trainer_busy, what="the training pod's GPU busy in the gauges", timeout=25)

        async def every_gpu_rolled_up() -> bool:
            return await scalar(db, "SELECT count(DISTINCT gpu_uuid) FROM telemetry.gpu_rollups") == 8

        await eventually(every_gpu_rolled_up, what="rollups of every GPU", timeout=25)
        busiest = await scalar(db, "SELECT max(utilization_max_pct) FROM telemetry.gpu_rollups")
        assert isinstance(busiest, float) and busiest > 50  # the training pod's GPU


def job_pod(name: str, node: str, profile: str, milli: int | None = None) -> dict[str, object]:
    body = pod(name, node, profile)
    if milli is not None:
        body["metadata"]["annotations"]["tessera.io/gpu-milli"] = str(milli)  # type: ignore[index]
    return body


async def test_two_tenants_jobs_are_billed_with_used_below_allocated_and_an_idle_job_flagged(
    system: tuple[str, str], devcluster: DevCluster
) -> None:
    """Admission's and the scheduler's events name the jobs; the devcluster's PodResources and NVML
    readings tell who uses what; GET /v1/usage bills both tenants."""
    from tessera.contracts.events import GangPlaced, GpuAssignment, JobAccepted, PodPlacement
    from tessera.core.messaging.envelope import encode
    from tessera.core.messaging.streams import ensure_stream
    from tessera.core.settings import StreamSettings

    nats_url, db = system
    settings = settings_for(
        TelemetrySettings,
        nats_url,
        db,
        devcluster_url=devcluster.url,
        sample_interval_s=0.5,
        usage={
            "flush_interval_s": 0.5,
            "idle_window_s": 1.0,
            "rightsizing_window_s": 3.0,
            "rightsizing_min_samples": 3,
        },
        pricing={"flavors": [{"name": "a100", "gpu_model": "A100-80GB", "on_demand_per_gpu_hour": 4.0}]},
        auth="disabled",
    )
    async with httpx.AsyncClient() as http:
        for name, profile, milli in (
            ("train-0", "training", None),
            ("sleepy-0", "idle", None),
            ("infer-0", "inference", 300),
        ):
            created = await http.post(
                f"{devcluster.url}/api/v1/namespaces/default/pods",
                json=job_pod(name, "gpu-node-0", profile, milli),
            )
            assert created.status_code == 201, created.text
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    for owner in ("admission", "scheduler"):
        await ensure_stream(js, owner, StreamSettings().limits())
    inventory = {r.index: r.uuid for r in devcluster.nvml_readings("gpu-node-0")}
    with devcluster.ctx.lock:
        held = {key.split("/")[1]: d.holdings for key, d in devcluster.ctx.devices.items()}
    messages = [
        JobAccepted(job_id="job-train", name="train", tenant="team-a", queue="research"),
        JobAccepted(job_id="job-sleepy", name="sleepy", tenant="team-b", queue="serving"),
        JobAccepted(job_id="job-infer", name="infer", tenant="team-b", queue="serving"),
    ]
    for job, pod_name in (("job-train", "train-0"), ("job-sleepy", "sleepy-0"), ("job-infer", "infer-0")):
        gpus = [
            GpuAssignment(
                index=next(i for i, u in inventory.items() if u == h.gpu_uuid),
                uuid=h.gpu_uuid,
                milli=max(1, h.milli),
            )
            for h in held[pod_name]
        ]
        messages.append(
            GangPlaced(
                job_id=job, placements=[PodPlacement(pod=pod_name, group="g", node="gpu-node-0", gpus=gpus)]
            )
        )
    for message in messages:
        subject, headers, body = encode(message, "tessera/test")
        await js.publish(subject, body, headers=headers)
    await nc.close()

    async with running(bootstrap.build(settings), settings) as service:
        from fastapi import FastAPI

        from tessera.telemetry.entrypoints.usage_api import router

        app = FastAPI()
        app.include_router(router)
        app.state.deps = service.deps

        seen: dict[str, dict[str, object]] = {}

        async def by_tenant() -> dict[str, dict[str, object]] | None:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
                body = (await http.get("/v1/usage", params={"by": "tenant"})).json()
            seen.clear()
            seen.update({r["group"]: r for r in body["rows"]})
            ready = {"team-a", "team-b"} <= set(seen) and seen["team-b"]["idle_gpu_hours"] > 0
            return dict(seen) if ready else None

        # generous: a loaded 2-core CI machine runs the sampler, the relay and the consumers slowly
        try:
            rows = await eventually(by_tenant, what="usage of both tenants with an idle job", timeout=90)
        except AssertionError as timed_out:
            raise AssertionError(f"{timed_out}; usage rows at the end: {seen}") from None
        for tenant in ("team-a", "team-b"):
            assert 0 < rows[tenant]["used_gpu_hours"] < rows[tenant]["allocated_gpu_hours"]
            assert 0 < rows[tenant]["utilisation_pct"] < 100
            assert rows[tenant]["cost"] > 0
        assert await scalar(db, "SELECT count(*) FROM telemetry.usage_hourly WHERE job_id = 'unknown'") == 0
        assert await scalar(db, "SELECT min(split) FROM telemetry.usage_hourly WHERE pod = 'infer-0'") in (
            "memory",
            "requested",
        )

        async def recommended() -> list[dict[str, object]]:
            return await events(nats_url, subjects.RIGHTSIZING_RECOMMENDED)

        found = await eventually(recommended, what="a rightsizing recommendation", timeout=90)
        assert any(e["pod"] == "sleepy-0" and e["tenant"] == "team-b" for e in found)

        # what was attributed also goes to slicing: one batch per node and round, every pod in it
        batches = await events(nats_url, subjects.pod_gpu_usage("gpu-node-0"))
        rounds = await sampling_rounds(nats_url, "gpu-node-0")
        assert 0 < len(batches) <= rounds
        newest: list[Any] = list(batches[-1]["pods"])  # type: ignore[call-overload]
        assert {u["pod"] for u in newest} == {"train-0", "sleepy-0", "infer-0"}
        assert all(u["allocated_milli"] > 0 and u["split"] in ("memory", "requested") for u in newest)
