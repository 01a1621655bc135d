"""Slicing killed between writing the MIG label and the MIG manager's `success` resumes the stored
operation after a restart (it does not apply again, and it uncordons the node it cordoned); two
replicas never drive one node's operation at once; a node pinned by hand is never planned."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from tessera.cluster.cluster_file import NodeSpec
from tessera.cluster.conventions import MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL
from tessera.cluster.kube import api_client
from tessera.contracts import subjects
from tessera.contracts.events import DemandChanged, GpuDemand
from tessera.core.db.engine import async_url, make_session_factory
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.slicing import bootstrap
from tessera.slicing.adapters import orm
from tessera.slicing.adapters.kube import KubeClusterOps
from tessera.slicing.domain.operation import (
    ChangeKind,
    GpuTarget,
    NodeChange,
    Operation,
    OpState,
    RetryPolicy,
)
from tessera.slicing.service_layer.cluster_view import PIN_LABEL, PIN_VALUE
from tessera.slicing.service_layer.operating import Operator, step
from tessera.slicing.service_layer.unit_of_work import SlicingUnitOfWork
from tessera.testing.services import ServiceProcess, eventually, running

from .conftest import Kube, Stack

pytestmark = pytest.mark.integration

MIG_DEMAND = DemandChanged(
    pending_gangs=1, demand=[GpuDemand(gpus=1, milli=1000, mig_profile="3g.40gb", pods=1)]
)


@pytest.fixture
def devcluster() -> Iterator[DevCluster]:
    nodes = [NodeSpec("a100-0", 64_000, 512_000, "A100-80GB", 1, 81920, {})]
    settings = SimSettings(speed=1.0, pod_start_seconds=0.2, mig_reconfigure_seconds=4.0)
    with DevCluster(nodes, settings=settings) as cluster:
        yield cluster


@pytest.fixture
def kube(devcluster: DevCluster, tmp_path: Path) -> Iterator[tuple[Kube, Path]]:
    kubeconfig = devcluster.write_kubeconfig(tmp_path / "kubeconfig")
    api = Kube(kubeconfig)
    yield api, kubeconfig
    api.close()


def slicing_process(stack: Stack, kubeconfig: Path, log_dir: Path) -> ServiceProcess:
    return ServiceProcess(
        "slicing",
        {
            "TESSERA_NATS_URL": stack.nats_url,
            "TESSERA_DATABASE_URL": stack.db,
            "TESSERA_SLICING_KUBECONFIG": str(kubeconfig),
            "TESSERA_SLICING_OUTBOX_POLL_S": "0.05",
            "TESSERA_SLICING_TICK_S": "0.1",
            "TESSERA_SLICING_LEASE_S": "2",
            "TESSERA_SLICING_PLANNING__WINDOW_S": "1",
            "TESSERA_SLICING_PLANNING__IDLE_S": "0.2",
            "TESSERA_SLICING_PLANNING__MIN_DWELL_S": "0",
        },
        log_dir,
    )


async def test_killed_between_the_label_and_success_it_resumes_the_operation_after_a_restart(
    stack: Stack, kube: tuple[Kube, Path], tmp_path: Path
) -> None:
    api, kubeconfig = kube
    first = slicing_process(stack, kubeconfig, tmp_path)
    first.start({"TESSERA_SLICING_REPLICA": "first"})
    try:
        await first.wait_ready()
        await stack.publish(MIG_DEMAND)

        async def pending() -> bool:
            # the label is patched before the step that wrote it commits `written`: wait for both
            labels = await api.labels("a100-0")
            labelled = labels.get(MIG_CONFIG_LABEL, "").startswith("tessera-") and (
                labels.get(MIG_CONFIG_STATE_LABEL) == "pending"
            )
            rows = await stack.rows("SELECT state, written FROM slicing.operations")
            return labelled and rows == [("applying", True)]

        await eventually(
            pending, timeout=60, interval=0.02, what="the MIG manager working on the label slicing stored"
        )
        assert first.proc is not None
        first.proc.kill()  # SIGKILL: no clean shutdown, the operation is left in `applying`
        await first.wait_exit()
    finally:
        first.stop()
    [(state, written)] = await stack.rows("SELECT state, written FROM slicing.operations")
    assert (state, written) == ("applying", True)

    async def succeeded_in_the_cluster() -> bool:
        return (await api.labels("a100-0")).get(MIG_CONFIG_STATE_LABEL) == "success"

    await eventually(succeeded_in_the_cluster, timeout=30, what="the MIG manager finishing alone")
    assert (await api.node("a100-0")).spec.unschedulable  # nobody uncordoned it yet

    second = slicing_process(stack, kubeconfig, tmp_path)
    second.start({"TESSERA_SLICING_REPLICA": "second"})
    try:
        await second.wait_ready()
        [done] = await eventually(
            lambda: stack.events(subjects.RECONFIGURED), timeout=30, what="reconfigured after the restart"
        )
        assert done.attempts == 1 and done.node == "a100-0"
        assert not (await api.node("a100-0")).spec.unschedulable
        steps = await stack.rows("SELECT state, attempts FROM slicing.operation_steps ORDER BY seq")
        assert steps == [("planned", 0), ("cordoned", 0), ("applying", 1), ("verifying", 1), ("succeeded", 1)]
        assert (await api.labels("a100-0"))[MIG_CONFIG_LABEL].endswith("-1")  # applied once, not again
    finally:
        second.stop()


async def test_two_replicas_never_drive_one_node_at_once(stack: Stack, kube: tuple[Kube, Path]) -> None:
    _, kubeconfig = kube
    engine = create_async_engine(async_url(stack.db))
    sessions = make_session_factory(engine)
    cluster = KubeClusterOps(api_client(kubeconfig=str(kubeconfig)))

    def uow() -> SlicingUnitOfWork:
        return SlicingUnitOfWork(sessions, orm.outbox, orm.inbox, "tessera/slicing")

    def replica(name: str) -> Operator:
        return Operator(cluster, uow, name, RetryPolicy(), timedelta(seconds=1), lambda: datetime.now(UTC))

    gpu = GpuTarget(0, NodeSpec("a100-0", 1, 1).gpu_uuid(0), "mig", ("3g.40gb", "3g.40gb"))
    change = NodeChange("a100-0", ChangeKind.MIG, "tessera-race", "[]", (gpu,), {"nvidia.com/mig-3g.40gb": 2})
    try:
        async with uow() as unit:
            assert await unit.operations.add(Operation.plan("op-race", change, datetime.now(UTC)))
            await unit.commit()
        a, b = replica("a"), replica("b")
        results = await asyncio.gather(step(a, "op-race"), step(b, "op-race"))
        assert sorted(results) == [False, True]  # one replica cordoned the node, the other found it taken
        winner, loser = (a, b) if results[0] else (b, a)
        assert await _holder(stack) == winner.holder
        assert not await step(loser, "op-race")
        [(state,)] = await stack.rows("SELECT state FROM slicing.operations")
        assert state == OpState.CORDONED
        await asyncio.sleep(1.1)  # the winner stopped renewing: its lease runs out
        assert await step(loser, "op-race")
        assert await _holder(stack) == loser.holder
        [(state,)] = await stack.rows("SELECT state FROM slicing.operations")
        assert state == OpState.APPLYING
    finally:
        await cluster.close()
        await engine.dispose()


async def _holder(stack: Stack) -> str | None:
    rows = await stack.rows("SELECT holder FROM slicing.node_leases WHERE expires_at > now()")
    return rows[0][0] if rows else None


async def test_a_node_pinned_by_hand_is_never_planned_but_its_neighbour_is(
    stack: Stack, tmp_path: Path
) -> None:
    nodes = [
        NodeSpec("pinned", 64_000, 512_000, "A100-80GB", 1, 81920, {PIN_LABEL: PIN_VALUE}),
        NodeSpec("free", 64_000, 512_000, "A100-80GB", 1, 81920, {}),
    ]
    with DevCluster(nodes, settings=SimSettings(mig_reconfigure_seconds=0.5)) as cluster:
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        api = Kube(kubeconfig)
        settings = stack.settings(kubeconfig)
        try:
            async with running(bootstrap.build(settings), settings):
                await stack.publish(
                    DemandChanged(
                        pending_gangs=2, demand=[GpuDemand(gpus=1, milli=1000, mig_profile="7g.80gb", pods=2)]
                    )
                )
                [done] = await eventually(
                    lambda: stack.events(subjects.RECONFIGURED), timeout=60, what="done"
                )
                assert done.node == "free"
                assert MIG_CONFIG_LABEL not in await api.labels("pinned")
                assert [e.node for e in await stack.events(subjects.LAYOUT_PLANNED)] == ["free"]
        finally:
            api.close()
