"""Driving operations on real Postgres over a cluster given as values (it records what slicing asks of
it): a GPU found held before anything is written rolls the operation back and uncordons the node; a
node someone else had cordoned stays cordoned after success, and one slicing cordoned in a step that
was lost before its commit is still uncordoned after success; a node that never advertises the change
fails the attempt at the verify deadline; an operation that fails for good leaves the node cordoned
under its own name (a cordon someone else holds is left unnamed); the MIG manager rebooting the node
does not count against the apply timeout, up to the reboot allowance; more time-slicing replicas on a
busy node are applied without a cordon or waiting for its pods."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.domain.gpu import Gpu
from tessera.cluster.domain.node import MigConfigState, Node
from tessera.cluster.domain.requirements import GpuRequest, GpuRequestKind, Pod, PodRequirements
from tessera.contracts.slicing import ReconfigFailed, Reconfigured
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
from tessera.slicing.service_layer.operating import Operator, step
from tessera.slicing.service_layer.ports import CORDONED_BY_ANNOTATION
from tessera.slicing.service_layer.unit_of_work import SlicingUnitOfWork

pytestmark = pytest.mark.integration
T0 = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)
POLICY = RetryPolicy(max_attempts=2, backoff=timedelta(seconds=1), verify_timeout=timedelta(seconds=10))


@dataclass
class RecordingCluster:
    node_value: Node
    pods: list[Pod] = field(default_factory=list)
    calls: list[tuple[str, ...]] = field(default_factory=list)

    async def nodes(self) -> list[Node]:
        return [self.node_value]

    async def node(self, name: str) -> Node:
        return self.node_value

    async def bound_pods(self) -> list[Pod]:
        return list(self.pods)

    async def pods_on(self, node: str) -> list[Pod]:
        return list(self.pods)

    async def cordon(self, node: str, unschedulable: bool, operation_id: str) -> None:
        self.calls.append(("cordon", node, str(unschedulable)))
        annotations = dict(self.node_value.annotations)
        if unschedulable:
            annotations[CORDONED_BY_ANNOTATION] = operation_id
        else:
            annotations.pop(CORDONED_BY_ANNOTATION, None)
        self.node_value = replace(self.node_value, unschedulable=unschedulable, annotations=annotations)

    async def write_mig_config(self, node: str, config: str, body: str) -> None:
        self.calls.append(("write_mig_config", node, config))
        self.node_value = replace(self.node_value, mig_config=config, mig_config_state=MigConfigState.PENDING)

    async def write_sharing_config(self, node: str, config: str, body: str) -> None:
        self.calls.append(("write_sharing_config", node, config))

    async def forget_configs(self, mig: bool, configs: list[str]) -> None:
        self.calls.append(("forget_configs", *configs))

    async def report_failure(self, node: str, operation_id: str, reason: str) -> None:
        self.calls.append(("report_failure", node, reason))

    async def clear_failure(self, node: str) -> None:
        self.calls.append(("clear_failure", node))


@pytest.fixture
async def engine(fresh_database: str) -> AsyncIterator[AsyncEngine]:
    await asyncio.to_thread(migrate, "slicing", fresh_database)
    engine = create_async_engine(async_url(fresh_database))
    yield engine
    await engine.dispose()


def a_node(unschedulable: bool = False) -> Node:
    gpus = (Gpu(0, "GPU-0", "A100-80GB", 81920),)
    return Node(
        "a100-0",
        64_000,
        512_000,
        gpus,
        unschedulable=unschedulable,
        extended_allocatable={"nvidia.com/gpu": 1},
    )


CHANGE = NodeChange(
    "a100-0",
    ChangeKind.MIG,
    "tessera-abc",
    "- devices: [0]\n  mig-enabled: true\n  mig-devices: {7g.80gb: 1}\n",
    (GpuTarget(0, "GPU-0", "mig", ("7g.80gb",)),),
    {"nvidia.com/gpu": 0, "nvidia.com/mig-7g.80gb": 1},
)


async def drive(
    engine: AsyncEngine, cluster: RecordingCluster, clock: list[datetime], change: NodeChange = CHANGE
) -> Operator:
    """An operator over `cluster` whose time is `clock[0]`, with operation op-1 planned for `change`."""
    sessions = make_session_factory(engine)

    def uow() -> SlicingUnitOfWork:
        return SlicingUnitOfWork(sessions, orm.outbox, orm.inbox, "tessera/slicing")

    operator = Operator(cluster, uow, "me", POLICY, timedelta(seconds=30), lambda: clock[0])  # type: ignore[arg-type]
    async with uow() as unit:
        assert await unit.operations.add(Operation.plan("op-1", change, clock[0]))
        await unit.commit()
    return operator


async def state_of(operator: Operator) -> OpState:
    async with operator.uow() as unit:
        op = await unit.operations.get("op-1")
        assert op is not None
        return op.state


async def outbox_types(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(orm.outbox.c.headers).order_by(orm.outbox.c.seq))
        return [row.headers["ce-type"] for row in rows]


async def test_a_gpu_found_held_before_the_write_rolls_back_and_uncordons(engine: AsyncEngine) -> None:
    cluster = RecordingCluster(a_node())
    clock = [T0]
    operator = await drive(engine, cluster, clock)
    assert await step(operator, "op-1")  # cordoned
    cluster.pods = [
        Pod(
            "default",
            "late",
            PodRequirements(gpu=GpuRequest(GpuRequestKind.WHOLE, count=1, milli=1000)),
            node_name="a100-0",
            assignment=DeviceAssignment("a100-0", (GpuShare("GPU-0"),)),
        )
    ]
    assert await step(operator, "op-1")
    assert await state_of(operator) is OpState.ROLLED_BACK
    assert cluster.calls == [("cordon", "a100-0", "True"), ("cordon", "a100-0", "False"), ("forget_configs",)]
    assert not cluster.node_value.unschedulable
    assert (await outbox_types(engine))[-1] == ReconfigFailed.TYPE


async def test_a_node_someone_else_cordoned_stays_cordoned_after_success(engine: AsyncEngine) -> None:
    cluster = RecordingCluster(a_node(unschedulable=True))
    clock = [T0]
    operator = await drive(engine, cluster, clock)
    while await step(operator, "op-1"):
        pass
    assert await state_of(operator) is OpState.APPLYING  # waiting for the MIG manager
    cluster.node_value = replace(
        cluster.node_value,
        mig_config_state=MigConfigState.SUCCESS,
        extended_allocatable={"nvidia.com/gpu": 0, "nvidia.com/mig-7g.80gb": 1},
    )
    while await step(operator, "op-1"):
        pass
    assert await state_of(operator) is OpState.SUCCEEDED
    assert not any(call[0] == "cordon" for call in cluster.calls)  # neither cordoned nor uncordoned
    assert cluster.node_value.unschedulable
    assert (await outbox_types(engine))[-1] == Reconfigured.TYPE


async def test_a_cordon_whose_step_never_committed_is_still_undone_after_success(engine: AsyncEngine) -> None:
    cluster = RecordingCluster(a_node())
    clock = [T0]
    operator = await drive(engine, cluster, clock)

    class Killed(Exception):
        pass

    def dying_uow() -> SlicingUnitOfWork:
        unit = operator.uow()

        async def commit() -> None:
            raise Killed("killed after the cordon, before the commit")

        unit.commit = commit  # type: ignore[method-assign]
        return unit

    with pytest.raises(Killed):
        await step(replace(operator, uow=dying_uow), "op-1")
    assert cluster.node_value.unschedulable  # the cordon happened; the step that did it was lost
    assert await state_of(operator) is OpState.PLANNED
    while await step(operator, "op-1"):  # the step again, finding the node already cordoned
        pass
    cluster.node_value = replace(
        cluster.node_value,
        mig_config_state=MigConfigState.SUCCESS,
        extended_allocatable={"nvidia.com/gpu": 0, "nvidia.com/mig-7g.80gb": 1},
    )
    while await step(operator, "op-1"):
        pass
    assert await state_of(operator) is OpState.SUCCEEDED
    assert not cluster.node_value.unschedulable  # slicing's own cordon, so slicing undid it
    assert CORDONED_BY_ANNOTATION not in cluster.node_value.annotations


async def test_a_node_that_never_advertises_the_change_fails_the_attempt_at_the_deadline(
    engine: AsyncEngine,
) -> None:
    cluster = RecordingCluster(a_node())
    clock = [T0]
    operator = await drive(engine, cluster, clock)
    while await step(operator, "op-1"):
        pass
    cluster.node_value = replace(
        cluster.node_value, mig_config_state=MigConfigState.SUCCESS
    )  # but no resources
    while await step(operator, "op-1"):
        pass
    assert await state_of(operator) is OpState.VERIFYING
    clock[0] = T0 + timedelta(seconds=11)
    assert await step(operator, "op-1")
    async with operator.uow() as unit:
        op = await unit.operations.get("op-1")
        assert op is not None and op.state is OpState.APPLYING and op.retry_at is not None
        assert "advertises nvidia.com/gpu=1, not nvidia.com/gpu=0, nvidia.com/mig-7g.80gb=1" in (
            op.reason or ""
        )


async def fail_for_good(operator: Operator, clock: list[datetime]) -> None:
    """Step until the operation ends, each verify deadline passing with the node unchanged."""
    for _ in range(20):
        while await step(operator, "op-1"):
            pass
        if await state_of(operator) is OpState.FAILED:
            return
        clock[0] += timedelta(minutes=6)  # past any deadline of POLICY
    raise AssertionError(f"op-1 is still {await state_of(operator)}")


async def test_a_failed_operation_leaves_the_node_cordoned_under_its_own_name(engine: AsyncEngine) -> None:
    """A change that never cordoned (more time-slicing replicas) fails for good: the cordon it leaves
    names the operation, like every cordon slicing writes, and the operation counts it as its own."""
    cluster = RecordingCluster(time_sliced_node(2))
    clock = [T0]
    operator = await drive(engine, cluster, clock, sharing(4))
    await fail_for_good(operator, clock)
    assert cluster.node_value.unschedulable
    assert cluster.node_value.annotations.get(CORDONED_BY_ANNOTATION) == "op-1"
    async with operator.uow() as unit:
        op = await unit.operations.get("op-1")
        assert op is not None and op.cordoned_by_us


async def test_a_failed_operation_leaves_a_cordon_someone_else_holds_unnamed(engine: AsyncEngine) -> None:
    cluster = RecordingCluster(replace(a_node(unschedulable=True), annotations={"owner": "a person"}))
    clock = [T0]
    operator = await drive(engine, cluster, clock)
    await fail_for_good(operator, clock)
    assert cluster.node_value.unschedulable
    assert CORDONED_BY_ANNOTATION not in cluster.node_value.annotations
    assert not any(call[0] == "cordon" for call in cluster.calls)


async def test_a_reboot_of_the_node_does_not_count_against_the_apply_timeout(engine: AsyncEngine) -> None:
    """The MIG manager reports rebooting for 3 of the attempt's 4 minutes, past a 1-minute apply timeout:
    the attempt succeeds, where before it failed at the first minute."""
    cluster = RecordingCluster(a_node())
    clock = [T0]
    policy = replace(POLICY, apply_timeout=timedelta(seconds=60), reboot_allowance=timedelta(minutes=5))
    operator = replace(await drive(engine, cluster, clock), policy=policy)
    while await step(operator, "op-1"):
        pass
    assert await state_of(operator) is OpState.APPLYING
    cluster.node_value = replace(cluster.node_value, mig_config_state=MigConfigState.REBOOTING)
    for seconds in range(30, 220, 20):  # stored between steps, as the deadline moves on
        clock[0] = T0 + timedelta(seconds=seconds)
        await step(operator, "op-1")
    async with operator.uow() as unit:
        op = await unit.operations.get("op-1")
        assert op is not None and (op.state, op.attempts, op.retry_at) == (OpState.APPLYING, 1, None)
        assert op.reboot_credit == timedelta(seconds=180) and op.rebooting_since == clock[0]
    clock[0] = T0 + timedelta(seconds=230)
    cluster.node_value = replace(
        cluster.node_value,
        mig_config_state=MigConfigState.SUCCESS,
        extended_allocatable={"nvidia.com/gpu": 0, "nvidia.com/mig-7g.80gb": 1},
    )
    while await step(operator, "op-1"):
        pass
    assert await state_of(operator) is OpState.SUCCEEDED


async def test_a_reboot_longer_than_the_allowance_still_fails_the_attempt(engine: AsyncEngine) -> None:
    cluster = RecordingCluster(a_node())
    clock = [T0]
    policy = replace(POLICY, apply_timeout=timedelta(seconds=60), reboot_allowance=timedelta(seconds=100))
    operator = replace(await drive(engine, cluster, clock), policy=policy)
    while await step(operator, "op-1"):
        pass
    cluster.node_value = replace(cluster.node_value, mig_config_state=MigConfigState.REBOOTING)
    for seconds in range(10, 160, 10):  # the deadline: 60 s, and 100 s of the reboot
        clock[0] = T0 + timedelta(seconds=seconds)
        await step(operator, "op-1")
        assert await state_of(operator) is OpState.APPLYING
    clock[0] = T0 + timedelta(seconds=170)
    assert await step(operator, "op-1")
    async with operator.uow() as unit:
        op = await unit.operations.get("op-1")
        assert op is not None and op.retry_at is not None
        assert "still pending after the apply timeout" in (op.reason or "")


def time_sliced_node(replicas: int) -> Node:
    gpus = (Gpu(0, "GPU-0", "A100-80GB", 81920),)
    return Node(
        "a100-0",
        64_000,
        512_000,
        gpus,
        gpu_replicas=replicas,
        extended_allocatable={"nvidia.com/gpu": replicas},
    )


def sharing(replicas: int) -> NodeChange:
    return NodeChange(
        "a100-0",
        ChangeKind.TIME_SLICING,
        f"tessera-dp-{replicas}",
        "version: v1\n",
        (GpuTarget(0, "GPU-0", "time_slicing", (), replicas),),
        {"nvidia.com/gpu": replicas},
    )


def share_pod(name: str) -> Pod:
    return Pod(
        "default",
        name,
        PodRequirements(gpu=GpuRequest(GpuRequestKind.FRACTIONAL, count=1, milli=400)),
        node_name="a100-0",
        assignment=DeviceAssignment("a100-0", (GpuShare("GPU-0", 400),)),
    )


async def test_more_replicas_on_a_busy_node_are_applied_without_waiting_for_its_pods(
    engine: AsyncEngine,
) -> None:
    cluster = RecordingCluster(time_sliced_node(2), pods=[share_pod("a"), share_pod("b")])
    clock = [T0]
    operator = await drive(engine, cluster, clock, sharing(4))
    while await step(operator, "op-1"):
        pass
    assert cluster.calls == [("write_sharing_config", "a100-0", "tessera-dp-4-1")]  # no cordon, no drain
    cluster.node_value = time_sliced_node(4)
    while await step(operator, "op-1"):
        pass
    assert await state_of(operator) is OpState.SUCCEEDED
    assert (await outbox_types(engine))[-1] == Reconfigured.TYPE


def whole_pod(name: str) -> Pod:
    return Pod(
        "default",
        name,
        PodRequirements(gpu=GpuRequest(GpuRequestKind.WHOLE, count=1, milli=1000)),
        node_name="a100-0",
        assignment=DeviceAssignment("a100-0", (GpuShare("GPU-0", 1000),)),
    )


async def test_a_sharing_change_that_would_take_a_share_a_pod_now_holds_is_rolled_back_unwritten(
    engine: AsyncEngine,
) -> None:
    """A time-slicing change goes uncordoned, so pods placed since its plan are read before it is
    written: fewer replicas than the GPU's pods, or sharing a GPU a pod holds whole, is rolled back."""
    for node, pods, replicas, why in (
        (
            time_sliced_node(4),
            [share_pod("a"), share_pod("b"), share_pod("c")],
            2,
            "more than its 2 replica(s)",
        ),
        (a_node(), [whole_pod("w")], 4, "default/w hold GPU 0 whole"),
    ):
        cluster = RecordingCluster(node, pods=pods)
        operator = await drive(engine, cluster, [T0], sharing(replicas))
        while await step(operator, "op-1"):
            pass
        assert not [c for c in cluster.calls if c[0].startswith("write")], "nothing written"
        async with operator.uow() as unit:
            op = await unit.operations.get("op-1")
            assert op is not None and op.state is OpState.ROLLED_BACK
            assert why in (op.reason or ""), op.reason
            await unit.session.execute(text("DELETE FROM slicing.operations"))
            await unit.commit()
        assert (await outbox_types(engine))[-1] == ReconfigFailed.TYPE
