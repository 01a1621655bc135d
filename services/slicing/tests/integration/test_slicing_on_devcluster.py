"""Slicing on a devcluster through the official `kubernetes` client, with real NATS and Postgres: the
scheduler's demand for a MIG profile reconfigures an idle A100 (never a busy one) and the pod then
runs on the new instance; fractional demand time-slices an idle node, or shares it under MPS when
every share fits a client's equal part; an apply the MIG manager keeps
failing is retried with backoff, then the node is left cordoned with a condition and an Event."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.cluster.builders import PodManifest
from tessera.cluster.cluster_file import NodeSpec
from tessera.cluster.conventions import (
    DEVICE_PLUGIN_CONFIG_LABEL,
    GPU_SHARING_STRATEGY_LABEL,
    MIG_CONFIG_LABEL,
    MIG_CONFIG_STATE_LABEL,
)
from tessera.cluster.conventions.assignment import encode_assignment
from tessera.cluster.conventions.names import GPU_ASSIGNMENT_ANNOTATION
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.contracts import subjects
from tessera.contracts.events import DemandChanged, GpuDemand
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.slicing import bootstrap
from tessera.slicing.adapters.kube import CONDITION_TYPE, EVENT_REASON
from tessera.slicing.service_layer.ports import CORDONED_BY_ANNOTATION
from tessera.testing.services import eventually, running

from .conftest import Kube, Stack

pytestmark = pytest.mark.integration

MIG_DEMAND = DemandChanged(
    pending_gangs=1, demand=[GpuDemand(gpus=1, milli=1000, mig_profile="3g.40gb", pods=1)]
)


def a100(name: str, gpus: int) -> NodeSpec:
    return NodeSpec(name, 64_000, 512_000, "A100-80GB", gpus, 81920, {})


def devcluster_of(*nodes: NodeSpec) -> DevCluster:
    return DevCluster(
        list(nodes), settings=SimSettings(speed=1.0, pod_start_seconds=0.2, mig_reconfigure_seconds=1.0)
    )


@pytest.fixture
def two_nodes() -> Iterator[DevCluster]:
    with devcluster_of(a100("a100-0", 2), a100("a100-1", 2)) as cluster:
        yield cluster


@pytest.fixture
def one_node() -> Iterator[DevCluster]:
    with devcluster_of(a100("a100-0", 1)) as cluster:
        yield cluster


@pytest.fixture
def kube(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Kube, Path]]:
    cluster = request.getfixturevalue(request.param)
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    api = Kube(kubeconfig)
    yield api, kubeconfig
    api.close()


@pytest.mark.parametrize("kube", ["two_nodes"], indirect=True)
async def test_a_pending_mig_pod_gets_an_idle_gpu_reconfigured_and_a_busy_one_is_left_alone(
    stack: Stack, kube: tuple[Kube, Path]
) -> None:
    api, kubeconfig = kube
    await api.create_pod(PodManifest("busy").gpus(2).obj())
    await api.bind("busy", "a100-0")  # both GPUs of a100-0 are in use
    await api.create_pod(PodManifest("wants-3g").scheduler().mig("3g.40gb").obj())
    settings = stack.settings(kubeconfig)
    async with running(bootstrap.build(settings), settings):
        await stack.publish(MIG_DEMAND)

        async def reconfigured() -> Any:
            labels, free = await api.labels("a100-1"), await api.allocatable("a100-1")
            ok = (
                labels.get(MIG_CONFIG_STATE_LABEL) == "success"
                and free.get("nvidia.com/mig-3g.40gb", "0") != "0"
            )
            return ok and not (await api.node("a100-1")).spec.unschedulable

        await eventually(reconfigured, timeout=60, what="a100-1 reconfigured with a 3g.40gb and uncordoned")
        assert (await api.labels("a100-1"))[MIG_CONFIG_LABEL].startswith("tessera-")
        assert MIG_CONFIG_LABEL not in await api.labels("a100-0")
        assert await api.phase("busy") == "Running"

        await api.bind("wants-3g", "a100-1")  # as the scheduler does once it sees the capacity
        await eventually(lambda: _is_running(api, "wants-3g"), what="the MIG pod running on its instance")

        [planned] = await stack.events(subjects.LAYOUT_PLANNED)
        [done] = await stack.events(subjects.RECONFIGURED)
        assert (planned.node, done.node, done.operation_id) == ("a100-1", "a100-1", planned.operation_id)
        assert done.kind == "mig" and "3g.40gb" in done.gpus[0].mig_profiles and done.attempts == 1
        steps = await stack.rows(
            f"SELECT state, attempts FROM slicing.operation_steps WHERE operation_id = '{done.operation_id}' ORDER BY seq"
        )
        assert steps == [("planned", 0), ("cordoned", 0), ("applying", 1), ("verifying", 1), ("succeeded", 1)]


async def _is_running(api: Kube, pod: str) -> bool:
    return await api.phase(pod) == "Running"


@pytest.mark.parametrize("kube", ["two_nodes"], indirect=True)
async def test_time_slicing_replicas_follow_fractional_demand(stack: Stack, kube: tuple[Kube, Path]) -> None:
    api, kubeconfig = kube
    await api.create_pod(PodManifest("busy").gpus(2).obj())
    await api.bind("busy", "a100-0")
    settings = stack.settings(kubeconfig)
    async with running(bootstrap.build(settings), settings):
        # a 600 share does not fit half a GPU, so these are time-sliced rather than shared under MPS
        demand = [GpuDemand(gpus=1, milli=600, pods=2), GpuDemand(gpus=1, milli=300, pods=2)]
        await stack.publish(DemandChanged(pending_gangs=4, demand=demand))
        replicas = await _shared(api, stack, "time_slicing")
        assert replicas >= 2
        assert (await api.labels("a100-1"))[GPU_SHARING_STRATEGY_LABEL] == "time-slicing"
        assert DEVICE_PLUGIN_CONFIG_LABEL not in await api.labels("a100-0")  # busy: left alone


@pytest.mark.parametrize("kube", ["two_nodes"], indirect=True)
async def test_shares_that_fit_equal_parts_are_shared_under_mps(
    stack: Stack, kube: tuple[Kube, Path]
) -> None:
    api, kubeconfig = kube
    await api.create_pod(PodManifest("busy").gpus(2).obj())
    await api.bind("busy", "a100-0")
    settings = stack.settings(kubeconfig)
    async with running(bootstrap.build(settings), settings):
        await stack.publish(DemandChanged(pending_gangs=6, demand=[GpuDemand(gpus=1, milli=250, pods=6)]))
        replicas = await _shared(api, stack, "mps")
        assert replicas * 250 <= 1000  # each client's part of memory and SMs holds its share
        assert replicas * 2 >= 6  # and the two GPUs have a replica for every pod
        # the device plugin (simulated) runs the MPS config the node's label names
        assert (await api.labels("a100-1"))[GPU_SHARING_STRATEGY_LABEL] == "mps"
        assert DEVICE_PLUGIN_CONFIG_LABEL not in await api.labels("a100-0")


async def _shared(api: Kube, stack: Stack, kind: str) -> int:
    """Wait until a100-1 advertises shared replicas and slicing reports it; its replicas per GPU."""

    async def sliced() -> Any:
        labels = await api.labels("a100-1")
        return (
            labels.get(DEVICE_PLUGIN_CONFIG_LABEL, "").startswith("tessera-dp-")
            and int((await api.allocatable("a100-1"))["nvidia.com/gpu"]) > 2
        )

    await eventually(sliced, timeout=60, what="a100-1 shared")
    [done] = await eventually(lambda: stack.events(subjects.RECONFIGURED), what="reconfigured")
    replicas = int(done.gpus[0].replicas)
    assert done.kind == kind and {g.replicas for g in done.gpus} == {replicas}
    assert (await api.allocatable("a100-1"))["nvidia.com/gpu"] == str(2 * replicas)
    return replicas


@pytest.mark.parametrize("kube", ["one_node"], indirect=True)
async def test_an_apply_that_keeps_failing_is_retried_then_the_node_is_left_cordoned_with_the_reason(
    stack: Stack, kube: tuple[Kube, Path]
) -> None:
    api, kubeconfig = kube
    # A process the device plugin hands the GPU to without the pod asking for it: Kubernetes shows no
    # GPU request, so the plan takes the GPU as idle, and the MIG manager finds it busy every time.
    share = GpuShare(NodeSpec("a100-0", 1, 1).gpu_uuid(0))
    hidden = PodManifest("hidden").annotate(
        GPU_ASSIGNMENT_ANNOTATION, encode_assignment(DeviceAssignment("a100-0", (share,)))
    )
    await api.create_pod(hidden.obj())
    await api.bind("hidden", "a100-0")
    await eventually(lambda: _is_running(api, "hidden"), what="the hidden holder running")
    settings = stack.settings(kubeconfig)
    async with running(bootstrap.build(settings), settings):
        await stack.publish(MIG_DEMAND)
        [failed] = await eventually(
            lambda: stack.events(subjects.RECONFIG_FAILED), timeout=60, what="reconfig_failed"
        )
        assert failed.outcome == "left_cordoned" and failed.attempts == 3
        assert "nvidia.com/mig.config.state is failed" in failed.reason
        node = await api.node("a100-0")
        assert node.spec.unschedulable
        assert node.metadata.annotations[CORDONED_BY_ANNOTATION] == failed.operation_id
        [condition] = [c for c in node.status.conditions if c.type == CONDITION_TYPE]
        assert condition.status == "True" and "3 attempts failed" in condition.message
        [event] = [e for e in await api.events_about("a100-0") if e.reason == EVENT_REASON]
        assert event.type == "Warning" and failed.operation_id in event.message
        steps = await stack.rows(
            f"SELECT state, attempts FROM slicing.operation_steps WHERE operation_id = '{failed.operation_id}' ORDER BY seq"
        )
        assert [s for s, _ in steps] == ["planned", "cordoned", "applying", "applying", "applying", "failed"]
        assert [a for _, a in steps][-1] == 3
        assert await stack.events(subjects.RECONFIGURED) == []
        labels = await api.labels("a100-0")
        assert labels[MIG_CONFIG_LABEL].endswith("-3") and labels[MIG_CONFIG_STATE_LABEL] == "failed"
        configmap = await asyncio.to_thread(
            api.core.read_namespaced_config_map, "custom-mig-config", "gpu-operator"
        )
        names = set(yaml.safe_load(configmap.data["config.yaml"])["mig-configs"])
        assert names == {labels[MIG_CONFIG_LABEL]}  # the earlier attempts' configs are gone
