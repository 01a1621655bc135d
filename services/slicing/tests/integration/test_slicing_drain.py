"""When slicing may change GPUs that pods hold (`planning.change_busy_gpus`), the node is cordoned and
the GPU drained first: the operation waits in `draining` until the pod ends, then applies, and never
touches the GPU while the pod holds it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.cluster.builders import PodManifest
from tessera.cluster.cluster_file import NodeSpec
from tessera.cluster.conventions.assignment import encode_assignment
from tessera.cluster.conventions.names import GPU_ASSIGNMENT_ANNOTATION, SIM_DURATION_ANNOTATION
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.contracts import subjects
from tessera.contracts.events import DemandChanged, GpuDemand
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.slicing import bootstrap
from tessera.testing.services import eventually, running

from .conftest import Kube, Stack

pytestmark = pytest.mark.integration


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[Kube, Path]]:
    nodes = [NodeSpec("a100-0", 64_000, 512_000, "A100-80GB", 1, 81920, {})]
    settings = SimSettings(speed=1.0, pod_start_seconds=0.2, mig_reconfigure_seconds=1.0)
    with DevCluster(nodes, settings=settings) as cluster:
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        api = Kube(kubeconfig)
        yield api, kubeconfig
        api.close()


async def test_a_busy_gpu_is_drained_before_it_is_reconfigured(stack: Stack, kube: tuple[Kube, Path]) -> None:
    api, kubeconfig = kube
    share = GpuShare(NodeSpec("a100-0", 1, 1).gpu_uuid(0))
    worker = (
        PodManifest("worker")
        .gpus(1)
        .annotate(GPU_ASSIGNMENT_ANNOTATION, encode_assignment(DeviceAssignment("a100-0", (share,))))
        .annotate(SIM_DURATION_ANNOTATION, "6")
    )
    await api.create_pod(worker.obj())
    await api.bind("worker", "a100-0")

    async def worker_running() -> bool:
        return await api.phase("worker") == "Running"

    await eventually(worker_running, what="the worker holding the GPU")
    settings = stack.settings(
        kubeconfig, planning={"window_s": 1.0, "idle_s": 0.2, "min_dwell_s": 0.0, "change_busy_gpus": True}
    )
    async with running(bootstrap.build(settings), settings):
        await stack.publish(
            DemandChanged(
                pending_gangs=1, demand=[GpuDemand(gpus=1, milli=1000, mig_profile="3g.40gb", pods=1)]
            )
        )
        [planned] = await eventually(lambda: stack.events(subjects.LAYOUT_PLANNED), what="layout_planned")
        assert planned.drain

        async def draining() -> bool:
            rows = await stack.rows("SELECT state FROM slicing.operations")
            return rows == [("draining",)]

        await eventually(draining, what="the operation waiting for the worker")
        assert await api.phase("worker") == "Running"  # still holding the GPU: nothing applied yet
        assert (await api.node("a100-0")).spec.unschedulable
        [done] = await eventually(
            lambda: stack.events(subjects.RECONFIGURED), timeout=60, what="reconfigured"
        )
        assert await api.phase("worker") == "Succeeded"  # it ended on its own; it was never evicted
        steps = await stack.rows(
            f"SELECT state FROM slicing.operation_steps WHERE operation_id = '{done.operation_id}' ORDER BY seq"
        )
        assert [s for (s,) in steps] == [
            "planned",
            "cordoned",
            "draining",
            "applying",
            "verifying",
            "succeeded",
        ]
        assert not (await api.node("a100-0")).spec.unschedulable
        assert (await api.allocatable("a100-0")).get("nvidia.com/mig-3g.40gb") in ("1", "2")
