"""The slicing schema on real Postgres: the migrations build exactly the tables the repositories use,
an operation survives a restart step by step, one node has one open operation however many replicas
plan, and a node's lease keeps a second replica off it until it expires or is released."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tessera.contracts.slicing import LayoutPlanned, ReconfigFailed
from tessera.core.db.engine import async_url, make_session_factory
from tessera.core.db.migrations import migrate
from tessera.slicing.adapters import orm
from tessera.slicing.domain.operation import (
    ChangeKind,
    GpuTarget,
    NodeChange,
    Operation,
    OpState,
    RetryPolicy,
)
from tessera.slicing.service_layer.unit_of_work import SlicingUnitOfWork

pytestmark = pytest.mark.integration
T0 = datetime.now(UTC).replace(microsecond=0)
POLICY = RetryPolicy(max_attempts=2, backoff=timedelta(seconds=1))


@pytest.fixture
async def engine(fresh_database: str) -> AsyncIterator[AsyncEngine]:
    await asyncio.to_thread(migrate, "slicing", fresh_database)
    engine = create_async_engine(async_url(fresh_database))
    yield engine
    await engine.dispose()


def unit(engine: AsyncEngine) -> SlicingUnitOfWork:
    return SlicingUnitOfWork(make_session_factory(engine), orm.outbox, orm.inbox, "tessera/slicing")


def a_change(node: str = "a100-0") -> NodeChange:
    gpu = GpuTarget(1, "GPU-1", "mig", ("3g.40gb", "3g.40gb"))
    return NodeChange(
        node,
        ChangeKind.MIG,
        "tessera-abc",
        "- devices: [1]\n",
        (gpu,),
        {"nvidia.com/mig-3g.40gb": 2},
        "all-disabled",
    )


async def test_the_migrations_build_the_tables_the_repositories_use(engine: AsyncEngine) -> None:
    def diff(connection: Any) -> list[Any]:
        context = MigrationContext.configure(
            connection,
            opts={
                "include_schemas": True,
                "include_name": _in_slicing_schema,
                "include_object": _an_operation_table,
            },
        )
        return list(compare_metadata(context, orm.metadata))

    async with engine.connect() as conn:
        assert await conn.run_sync(diff) == []


OPERATION_TABLES = {"operations", "operation_steps", "node_leases"}


def _in_slicing_schema(name: str | None, kind: str, parent: Any) -> bool:
    return name == "slicing" if kind == "schema" else True


def _an_operation_table(obj: Any, name: str | None, kind: str, reflected: bool, compare_to: Any) -> bool:
    """The operation tables and what is on them (the messaging tables are core's own)."""
    table = name if kind == "table" else getattr(getattr(obj, "table", None), "name", None)
    return table in OPERATION_TABLES


async def test_an_operation_is_read_back_as_stored_with_a_row_per_step(engine: AsyncEngine) -> None:
    async with unit(engine) as uow:
        assert await uow.operations.add(Operation.plan("op-1", a_change(), T0))
        await uow.commit()
        assert [type(m) for m in uow.published] == [LayoutPlanned]
    async with unit(engine) as uow:  # a restarted service reads it back and goes on
        op = await uow.operations.get("op-1")
        assert op is not None and op.change == a_change() and op.state is OpState.PLANNED
        op.cordoned(T0 + timedelta(seconds=1), by_us=True)
        await uow.operations.save(op)
        op.drained(T0 + timedelta(seconds=1), POLICY)
        op.written_config(T0 + timedelta(seconds=2))
        await uow.operations.save(op)
        await uow.commit()
    async with unit(engine) as uow:
        op = await uow.operations.get("op-1")
        assert op is not None
        assert (op.state, op.attempts, op.written, op.cordoned_by_us) == (OpState.APPLYING, 1, True, True)
        assert op.deadline == T0 + timedelta(seconds=1) + POLICY.apply_timeout
        op.attempt_failed("state failed", T0 + timedelta(seconds=3), POLICY)
        op.retry(T0 + timedelta(seconds=4), POLICY)
        op.attempt_failed("state failed again", T0 + timedelta(seconds=5), POLICY)
        await uow.operations.save(op)
        await uow.commit()
        assert [type(m) for m in uow.published] == [ReconfigFailed]
    async with unit(engine) as uow:
        assert [(s, a) for s, a, _ in await uow.operations.steps("op-1")] == [
            ("planned", 0),
            ("cordoned", 0),
            ("applying", 1),
            ("failed", 2),
        ]
        assert await uow.operations.open_ones() == []


async def test_one_open_operation_per_node_whichever_replica_plans(engine: AsyncEngine) -> None:
    async def plan(operation_id: str) -> bool:
        async with unit(engine) as uow:
            added = await uow.operations.add(Operation.plan(operation_id, a_change(), T0))
            await asyncio.sleep(0.05)  # hold the row while the others try
            await uow.commit()
            return added

    added = await asyncio.gather(*(plan(f"op-{i}") for i in range(4)))
    assert sorted(added) == [False, False, False, True]
    async with unit(engine) as uow:
        assert await uow.operations.add(Operation.plan("op-other", a_change("a100-1"), T0))
        [first, other] = await uow.operations.open_ones()
        assert (first.change.node, other.change.node) == ("a100-0", "a100-1")
        await uow.commit()


async def test_a_node_lease_keeps_a_second_replica_off_until_released_or_expired(engine: AsyncEngine) -> None:
    async def acquire(node: str, holder: str, ttl_s: float) -> bool:
        async with unit(engine) as uow:
            got = await uow.leases.acquire(node, holder, timedelta(seconds=ttl_s))
            await uow.commit()
            return got

    assert await acquire("a100-0", "replica-a", 30)
    assert not await acquire("a100-0", "replica-b", 30)
    assert await acquire("a100-0", "replica-a", 30)  # renewing one's own lease
    assert await acquire("a100-1", "replica-b", 30)  # another node is free
    async with unit(engine) as uow:
        await uow.leases.release("a100-0", "replica-b")  # not its lease: nothing happens
        await uow.commit()
    assert not await acquire("a100-0", "replica-b", 30)
    async with unit(engine) as uow:
        await uow.leases.release("a100-0", "replica-a")
        await uow.commit()
    assert await acquire("a100-0", "replica-b", 0.2)
    assert not await acquire("a100-0", "replica-a", 30)
    await asyncio.sleep(0.3)  # the holder stopped renewing: its lease runs out
    assert await acquire("a100-0", "replica-a", 30)


async def test_racing_replicas_never_both_hold_a_node(engine: AsyncEngine) -> None:
    results = await asyncio.gather(*(_acquire_in_own_unit(engine, f"replica-{i}") for i in range(6)))
    assert sum(results) == 1


async def _acquire_in_own_unit(engine: AsyncEngine, holder: str) -> bool:
    async with unit(engine) as uow:
        got = await uow.leases.acquire("a100-7", holder, timedelta(seconds=30))
        await asyncio.sleep(0.05)
        await uow.commit()
        return got
