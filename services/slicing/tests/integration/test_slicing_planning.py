"""Planning rounds on real Postgres over a cluster given as values: demand for a MIG profile no GPU
model of the cluster supports is explained (naming the profile and the models) and changes nothing,
round after round; demand for a supported one gets one operation; a node with an open operation is
seen as it will be, so the same demand does not reconfigure a second GPU."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tessera.cluster.domain.gpu import Gpu
from tessera.cluster.domain.node import Node
from tessera.cluster.domain.requirements import Pod
from tessera.core.db.engine import async_url, make_session_factory
from tessera.core.db.migrations import migrate
from tessera.slicing.adapters import orm
from tessera.slicing.domain.cluster_plan import PlannerSettings
from tessera.slicing.domain.demand import DemandWindow, PendingDemand, PodShape
from tessera.slicing.service_layer.planning import Planning, plan_round
from tessera.slicing.service_layer.unit_of_work import SlicingUnitOfWork

pytestmark = pytest.mark.integration
NOW = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)


class ClusterValues:
    """The cluster as fixed values: nodes, and no pods. Writes are not expected in a planning round."""

    def __init__(self, nodes: list[Node]) -> None:
        self._nodes = nodes

    async def nodes(self) -> list[Node]:
        return list(self._nodes)

    async def bound_pods(self) -> list[Pod]:
        return []

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"a planning round must not call {name}")


@pytest.fixture
async def engine(fresh_database: str) -> AsyncIterator[AsyncEngine]:
    await asyncio.to_thread(migrate, "slicing", fresh_database)
    engine = create_async_engine(async_url(fresh_database))
    yield engine
    await engine.dispose()


def planning(engine: AsyncEngine, nodes: list[Node]) -> Planning:
    sessions = make_session_factory(engine)

    def uow() -> SlicingUnitOfWork:
        return SlicingUnitOfWork(sessions, orm.outbox, orm.inbox, "tessera/slicing")

    return Planning(
        ClusterValues(nodes), uow, DemandWindow(60, 1), PlannerSettings(min_dwell_s=0), lambda: NOW
    )  # type: ignore[arg-type]


def a100_node(name: str, gpus: int = 2) -> Node:
    return Node(
        name,
        64_000,
        512_000,
        tuple(Gpu(i, f"{name}-GPU-{i}", "A100-80GB", 81920) for i in range(gpus)),
        extended_allocatable={"nvidia.com/gpu": gpus},
    )


def demand(profile: str, pods: int, at: float) -> PendingDemand:
    return PendingDemand(at, ((PodShape.mig(profile), pods),))


async def test_a_profile_no_model_supports_is_explained_and_changes_nothing(engine: AsyncEngine) -> None:
    plans = planning(engine, [a100_node("a100-0"), a100_node("a100-1")])
    for round_ in range(3):  # round after round: no reconfiguration loop
        plans.window.add(demand("1g.12gb", 1, NOW.timestamp() - 10 - round_))
        assert await plan_round(plans) == []
        assert plans.last_plan is not None and not plans.last_plan.changes
        [why] = [e for e in plans.last_plan.explanations if "1g.12gb" in e]
        assert "A100-80GB" in why
    async with plans.uow() as uow:
        assert await uow.operations.open_ones() == []


async def test_one_operation_for_a_supported_profile_and_none_again_while_it_is_under_way(
    engine: AsyncEngine,
) -> None:
    plans = planning(engine, [a100_node("a100-0"), a100_node("a100-1")])
    plans.window.add(demand("3g.40gb", 2, NOW.timestamp() - 10))
    [created] = await plan_round(plans)
    plans.window.add(demand("3g.40gb", 2, NOW.timestamp() - 5))  # the pods still wait
    assert await plan_round(plans) == []  # the change under way will serve them
    assert plans.last_plan is not None and not plans.last_plan.changes  # not even on another node
    async with plans.uow() as uow:
        [op] = await uow.operations.open_ones()
        assert op.operation_id == created
        assert sum(g.mig_profiles.count("3g.40gb") for g in op.change.gpus) >= 2
