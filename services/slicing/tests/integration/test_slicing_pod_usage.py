"""Telemetry's per-pod use, on real NATS and Postgres, sizes time-sliced GPUs: batches shaped as
telemetry publishes them are folded into each pod's minutes by the slicing service; a planning round
after the service restarted sees that history and grows a busy time-sliced node's replicas for
pending shares (the pods measure 5 %), where the same pods without history, sized by their requested
milli, leave it as it is."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.domain.gpu import Gpu
from tessera.cluster.domain.node import Node
from tessera.cluster.domain.requirements import GpuRequest, GpuRequestKind, Pod, PodRequirements
from tessera.contracts.events import PodGpuShare, PodGpuUsage
from tessera.core.db.engine import async_url, make_session_factory
from tessera.slicing import bootstrap
from tessera.slicing.adapters import orm
from tessera.slicing.domain.cluster_plan import PlannerSettings
from tessera.slicing.domain.demand import DemandWindow, PendingDemand, PodShape
from tessera.slicing.domain.usage_history import UsageSettings
from tessera.slicing.service_layer.planning import Planning, plan_round
from tessera.slicing.service_layer.unit_of_work import SlicingUnitOfWork
from tessera.testing.services import eventually, running

from .conftest import Stack

pytestmark = pytest.mark.integration

NODE = "ts-0"
GPU = f"{NODE}-GPU-0"
USAGE = UsageSettings(
    lookback_minutes=60, half_life_minutes=30.0, overload_budget=0.008, min_history_minutes=10
)


class ClusterValues:
    """A node time-sliced in two, both replicas held by share pods of 400 milli."""

    def __init__(self, pods: list[str]) -> None:
        self.pods = pods

    async def nodes(self) -> list[Node]:
        gpus = (Gpu(0, GPU, "A100-80GB", 81920),)
        return [Node(NODE, 64_000, 512_000, gpus, gpu_replicas=2, extended_allocatable={"nvidia.com/gpu": 2})]

    async def bound_pods(self) -> list[Pod]:
        request = GpuRequest(GpuRequestKind.FRACTIONAL, count=1, milli=400)
        return [
            Pod(
                "serving",
                name,
                PodRequirements(gpu=request),
                node_name=NODE,
                assignment=DeviceAssignment(NODE, (GpuShare(GPU, 400),)),
            )
            for name in self.pods
        ]

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"a planning round must not call {name}")


def batch(at: datetime, pct: float) -> PodGpuUsage:
    """What telemetry publishes for the node each round: both pods' share of the GPU."""
    return PodGpuUsage(
        node=NODE,
        at=at,
        interval_s=5.0,
        pods=[
            PodGpuShare(
                namespace="serving",
                pod=name,
                gpu_uuid=GPU,
                gpu_index=0,
                utilization_pct=pct,
                allocated_milli=400,
                split="memory",
            )
            for name in ("light-a", "light-b")
        ],
    )


@pytest.fixture
async def engine(stack: Stack) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(async_url(stack.db))
    yield engine
    await engine.dispose()


def planning(engine: AsyncEngine, pods: list[str], now: datetime) -> Planning:
    sessions = make_session_factory(engine)

    def uow() -> SlicingUnitOfWork:
        return SlicingUnitOfWork(sessions, orm.outbox, orm.inbox, "tessera/slicing")

    settings = PlannerSettings(min_dwell_s=0, usage=USAGE)
    plans = Planning(ClusterValues(pods), uow, DemandWindow(60, 1), settings, lambda: now)  # type: ignore[arg-type]
    plans.window.add(PendingDemand(now.timestamp() - 10, ((PodShape.share(400), 2),)))
    return plans


async def test_measured_light_pods_get_more_replicas_than_their_milli_and_a_restart_keeps_it(
    stack: Stack, engine: AsyncEngine
) -> None:
    now = datetime.now(UTC).replace(second=30, microsecond=0)

    async def forty_pod_minutes() -> bool:
        rows = await stack.rows("SELECT count(*), coalesce(sum(samples), 0) FROM slicing.pod_usage")
        return rows[0] == (40, 40)

    # 20 minutes of rounds at 5 % each, then the service stops
    await stack.publish(*(batch(now - timedelta(minutes=m), 5.0) for m in range(21, 1, -1)))
    settings = stack.settings(None)
    async with running(bootstrap.build(settings), settings):
        await eventually(forty_pod_minutes, what="40 pod-minutes stored, one reading each")

    # a restarted service goes on adding to the same minutes' history
    await stack.publish(
        batch(now - timedelta(minutes=1), 5.0), batch(now - timedelta(minutes=1, seconds=-5), 5.0)
    )
    async with running(bootstrap.build(settings), settings):

        async def second_minute() -> bool:
            rows = await stack.rows("SELECT max(samples) FROM slicing.pod_usage")
            return bool(rows[0][0] == 2)

        await eventually(second_minute, what="two readings in the newest minute")

    # the same node with pods that have no history: by requested milli nothing more fits
    unmeasured = planning(engine, ["new-a", "new-b"], now)
    assert await plan_round(unmeasured) == []
    assert unmeasured.last_plan is not None and unmeasured.last_plan.changes == ()

    # with history (read from Postgres by a planner that never saw the events): 2 -> 4 replicas
    measured = planning(engine, ["light-a", "light-b"], now)
    [created] = await plan_round(measured)
    async with measured.uow() as uow:
        [op] = await uow.operations.open_ones()
    assert op.operation_id == created
    [target] = op.change.gpus
    assert (target.kind, target.replicas) == ("time_slicing", 4)
    assert op.change.drain is False  # the running pods keep their replicas
    assert "by measured use" in op.change.reason and "2 -> 4" in op.change.reason
    assert op.change.expected_resources["nvidia.com/gpu"] == 4
