"""The loop that drives every open operation, on real Postgres over clusters given as values: an
operation whose steps keep failing is retried on its own (logged once, not every round) while the
others move; an operation whose node was deleted ends, rolled back, with the reason that the node is
gone, instead of failing every round."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import datetime

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tessera.cluster.domain.node import Node
from tessera.cluster.port import ClusterError, NotFound
from tessera.slicing.domain.operation import Operation, OpState
from tessera.slicing.entrypoints.loops import drive_operations
from tessera.slicing.service_layer.dependencies import SlicingDeps
from tessera.slicing.service_layer.operating import Operator
from tessera.testing.services import eventually

from .test_slicing_operating import CHANGE, T0, RecordingCluster, a_node, drive, engine, state_of

__all__ = ["engine"]  # the fixture, shared with the operating tests

pytestmark = pytest.mark.integration


class TwoNodes(RecordingCluster):
    """a100-0 as given; `other` deleted (NotFound) or failing (an API error) on every read."""

    other_error: ClusterError = NotFound('nodes "other" not found')

    async def node(self, name: str) -> Node:
        if name == "other":
            raise self.other_error
        return self.node_value


async def _older_operation_on_other(operator: Operator) -> None:
    async with operator.uow() as unit:
        older = Operation.plan("op-0", replace(CHANGE, node="other"), T0.replace(hour=5))
        assert await unit.operations.add(older)
        await unit.commit()


async def _op(operator: Operator, operation_id: str) -> Operation:
    async with operator.uow() as unit:
        op = await unit.operations.get(operation_id)
        assert op is not None
        return op


async def _drive_until(operator: Operator, done: object, what: str) -> None:
    deps = SlicingDeps(stop=asyncio.Event(), tick_s=0.05, operator=operator)
    task = asyncio.create_task(drive_operations(deps))
    try:
        await eventually(done, timeout=15, what=what)  # type: ignore[arg-type]
    finally:
        deps.stop.set()
        await task


async def test_an_operation_whose_node_is_gone_ends_and_the_others_move(engine: AsyncEngine) -> None:
    cluster = TwoNodes(a_node())
    clock: list[datetime] = [T0]
    operator = await drive(engine, cluster, clock)  # op-1 on a100-0
    await _older_operation_on_other(operator)

    async def both_moved() -> bool:
        gone = await _op(operator, "op-0")
        return gone.state is OpState.ROLLED_BACK and await state_of(operator) is OpState.APPLYING

    await _drive_until(operator, both_moved, "op-0 ended and op-1 applying")
    gone = await _op(operator, "op-0")
    assert gone.reason == "node other is gone"
    assert ("write_mig_config", "a100-0", "tessera-abc-1") in cluster.calls


async def test_an_operation_that_keeps_failing_does_not_hold_the_others_back(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = TwoNodes(a_node())
    cluster.other_error = ClusterError("HTTP 500: etcdserver: request timed out")
    clock: list[datetime] = [T0]
    operator = await drive(engine, cluster, clock)
    await _older_operation_on_other(operator)

    async def moved() -> bool:
        return await state_of(operator) is OpState.APPLYING

    with caplog.at_level(logging.WARNING, logger="tessera.slicing.entrypoints.loops"):
        await _drive_until(operator, moved, "op-1 applying")
        await asyncio.sleep(1.5)  # op-0 fails again in later rounds
    assert (await _op(operator, "op-0")).state is OpState.PLANNED  # still retried: not a lost node
    failures = [r for r in caplog.records if getattr(r, "operation", None) == "op-0"]
    assert len(failures) == 1, failures  # once, not every round
