"""Driving an operation step by step over in-memory fakes: a node deleted at the very moment the last
attempt fails (while slicing leaves it cordoned or reports the failure on it) ends the operation
`node_gone`, not `left_cordoned`, since there is no node left cordoned; a node still there is."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest

from tessera.cluster.domain.gpu import Gpu
from tessera.cluster.domain.node import MigConfigState, Node
from tessera.cluster.domain.requirements import Pod
from tessera.cluster.port import NotFound
from tessera.contracts.slicing import ReconfigFailed
from tessera.slicing.domain.operation import (
    ChangeKind,
    GpuTarget,
    NodeChange,
    Operation,
    OpState,
    RetryPolicy,
)
from tessera.slicing.service_layer.operating import Operator, step
from tessera.slicing.service_layer.unit_of_work import SlicingUnitOfWork
from tessera.testing.fakes import FakeRecordingUnitOfWork

T0 = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)
POLICY = RetryPolicy(max_attempts=1)  # the first failed attempt is the last
CHANGE = NodeChange(
    "a100-0",
    ChangeKind.MIG,
    "tessera-abc",
    "- devices: [0]\n  mig-enabled: true\n  mig-devices: {7g.80gb: 1}\n",
    (GpuTarget(0, "GPU-0", "mig", ("7g.80gb",)),),
    {"nvidia.com/gpu": 0, "nvidia.com/mig-7g.80gb": 1},
)


@dataclass
class VanishingCluster:
    """One node, deleted when the armed call is made (that call, and every later one on the node,
    then raises NotFound, as the API server answers for a deleted node)."""

    node_value: Node
    vanish_on: tuple[str, int] | None = None  # (method, its nth call from now)
    gone: bool = False
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def _touch(self, method: str) -> None:
        if self.vanish_on is not None and self.vanish_on[0] == method:
            remaining = self.vanish_on[1] - 1
            self.vanish_on = (method, remaining) if remaining else None
            self.gone = self.gone or not remaining
        if self.gone:
            raise NotFound(f'nodes "{self.node_value.name}" not found')

    async def nodes(self) -> list[Node]:
        return [] if self.gone else [self.node_value]

    async def node(self, name: str) -> Node:
        self._touch("node")
        return self.node_value

    async def bound_pods(self) -> list[Pod]:
        return []

    async def pods_on(self, node: str) -> list[Pod]:
        return []

    async def cordon(self, node: str, unschedulable: bool, operation_id: str) -> None:
        self._touch("cordon")
        self.calls.append(("cordon", node, str(unschedulable)))
        self.node_value = replace(self.node_value, unschedulable=unschedulable)

    async def write_mig_config(self, node: str, config: str, body: str) -> None:
        self._touch("write_mig_config")
        self.calls.append(("write_mig_config", node, config))
        self.node_value = replace(self.node_value, mig_config=config, mig_config_state=MigConfigState.PENDING)

    async def write_sharing_config(self, node: str, config: str, body: str) -> None:
        raise AssertionError("a MIG change writes no sharing config")

    async def forget_configs(self, mig: bool, configs: list[str]) -> None:
        self.calls.append(("forget_configs", *configs))

    async def report_failure(self, node: str, operation_id: str, reason: str) -> None:
        self._touch("report_failure")
        self.calls.append(("report_failure", node, reason))

    async def clear_failure(self, node: str) -> None:
        self._touch("clear_failure")
        self.calls.append(("clear_failure", node))

    async def mark_draining(self, node: str, deadline: datetime | None) -> None:
        raise AssertionError("no checkpoint notice: nothing is marked draining")

    async def evict(self, pod: Pod) -> None:
        raise AssertionError("no pods: nothing is evicted")


class MemoryOperations:
    def __init__(self, uow: FakeSlicingUnitOfWork) -> None:
        self.uow = uow
        self.stored: dict[str, Operation] = {}

    async def get(self, operation_id: str) -> Operation | None:
        op = self.stored.get(operation_id)
        if op is not None:
            self.uow.track(op)
        return op

    async def save(self, op: Operation) -> None:
        self.stored[op.operation_id] = op


class AlwaysLeased:
    async def acquire(self, node: str, holder: str, ttl: timedelta) -> bool:
        return True

    async def release(self, node: str, holder: str) -> None:
        pass


class FakeSlicingUnitOfWork(FakeRecordingUnitOfWork, SlicingUnitOfWork):
    """Operations kept in memory across units (the same objects: a unit not committed is not undone,
    so tests commit through `step` only); every lease is granted."""

    def __init__(self) -> None:
        super().__init__()
        self.memory = MemoryOperations(self)

    def open_repositories(self, session: object) -> None:
        super().open_repositories(session)
        self.operations = self.memory  # type: ignore[assignment]
        self.leases = AlwaysLeased()


def a_node() -> Node:
    return Node("a100-0", 64_000, 512_000, (Gpu(0, "GPU-0", "A100-80GB", 81920),))


async def written(cluster: VanishingCluster) -> tuple[Operator, FakeSlicingUnitOfWork]:
    """op-1 driven until its one attempt is written and the MIG manager reports it failed."""
    uow = FakeSlicingUnitOfWork()
    uow.memory.stored["op-1"] = Operation.plan("op-1", CHANGE, T0)
    operator = Operator(cluster, lambda: uow, "me", POLICY, timedelta(seconds=30), lambda: T0)
    while await step(operator, "op-1"):
        pass
    op = uow.memory.stored["op-1"]
    assert op.state is OpState.APPLYING and op.written and op.cordoned_by_us
    cluster.node_value = replace(cluster.node_value, mig_config_state=MigConfigState.FAILED)
    cluster.calls.clear()
    return operator, uow


def outcomes(uow: FakeSlicingUnitOfWork) -> list[str]:
    return [event.outcome for event in uow.outbox if isinstance(event, ReconfigFailed)]


@pytest.mark.parametrize(
    "vanish_on",
    [("node", 2), ("cordon", 1), ("report_failure", 1)],
    ids=["leaving-it-cordoned-reads-it", "cordoning-it", "reporting-on-it"],
)
async def test_a_node_deleted_as_the_last_attempt_fails_ends_the_operation_node_gone(
    vanish_on: tuple[str, int],
) -> None:
    cluster = VanishingCluster(a_node())
    operator, uow = await written(cluster)
    cluster.vanish_on = vanish_on  # the step reads the node (state failed), then it is deleted
    assert await step(operator, "op-1")
    op = uow.memory.stored["op-1"]
    assert cluster.gone and op.state is OpState.FAILED
    assert outcomes(uow) == ["node_gone"]  # before: left_cordoned, with no node left to be cordoned
    assert op.reason == "node a100-0 is gone"
    assert not any(call[0] == "report_failure" for call in cluster.calls)


async def test_a_node_still_there_when_the_last_attempt_fails_is_left_cordoned_and_told() -> None:
    cluster = VanishingCluster(a_node())
    operator, uow = await written(cluster)
    assert await step(operator, "op-1")
    op = uow.memory.stored["op-1"]
    assert op.state is OpState.FAILED and outcomes(uow) == ["left_cordoned"]
    reason = "1 attempts failed; last: nvidia.com/mig.config.state is failed for tessera-abc-1"
    assert op.reason == reason
    assert cluster.calls == [
        ("cordon", "a100-0", "True"),
        ("report_failure", "a100-0", reason),
        ("forget_configs",),
    ]
