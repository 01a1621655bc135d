"""The planner's view of the cluster and the plan as node changes: current layouts from what a node
advertises, what pods hold (a GPU pod whose devices are unknown holds them all), a node pinned by
hand, and one change per node with its config, entries and the resources to verify."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import yaml

from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.domain.allocation import MigSlice as HeldSlice
from tessera.cluster.domain.gpu import Gpu, MigInstance, MigMode
from tessera.cluster.domain.node import Node
from tessera.cluster.domain.requirements import GpuRequest, GpuRequestKind, Pod, PodRequirements
from tessera.slicing.domain.layout import GpuChange, GpuLayout, LayoutPlan, MigSlice, SharingMode
from tessera.slicing.domain.operation import ChangeKind
from tessera.slicing.service_layer.cluster_view import (
    PIN_LABEL,
    PIN_VALUE,
    current_layouts,
    gpu_use,
    node_changes,
    node_state,
)

NOW = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)


def a100(index: int, mig: tuple[MigInstance, ...] = ()) -> Gpu:
    mode = MigMode.ENABLED if mig else MigMode.DISABLED
    return Gpu(index, f"GPU-{index}", "A100-80GB", 81920, mig_mode=mode, mig_instances=mig)


def a_node(*gpus: Gpu, replicas: int = 1, labels: dict[str, str] | None = None, **extra: int) -> Node:
    return Node(
        "n0", 64_000, 512_000, gpus, labels=labels or {}, gpu_replicas=replicas, extended_allocatable=extra
    )


def gpu_pod(name: str, shares: tuple[GpuShare, ...] | None) -> Pod:
    request = GpuRequest(GpuRequestKind.WHOLE, count=1, milli=1000)
    assignment = DeviceAssignment("n0", shares) if shares is not None else None
    return Pod("default", name, PodRequirements(gpu=request), node_name="n0", assignment=assignment)


def test_current_layouts_come_from_the_instances_and_the_device_plugins_replicas() -> None:
    mig = (MigInstance("3g.40gb", 0), MigInstance("3g.40gb", 4))
    assert current_layouts(a_node(a100(0), a100(1, mig))) == {
        0: GpuLayout.exclusive(),
        1: GpuLayout.mig_geometry([("3g.40gb", 0), ("3g.40gb", 4)]),
    }
    assert current_layouts(a_node(a100(0), replicas=4))[0] == GpuLayout.time_slicing(4)
    mps = a_node(a100(0), replicas=3, labels={"nvidia.com/gpu.sharing-strategy": "mps"})
    assert current_layouts(mps)[0] == GpuLayout.mps(3)


def test_a_gpu_pod_without_known_devices_holds_every_gpu_and_held_slices_are_kept() -> None:
    mig = (MigInstance("3g.40gb", 0), MigInstance("3g.40gb", 4))
    node = a_node(a100(0), a100(1, mig))
    use = gpu_use(node, [gpu_pod("unknown", None)])
    assert all(u.pods == {"default/unknown"} for u in use.values())
    held = gpu_use(node, [gpu_pod("mig", (GpuShare("GPU-1", mig=HeldSlice("3g.40gb", 4)),))])
    assert held["GPU-0"].pods == set() and held["GPU-1"].slices == {MigSlice(start=4, profile="3g.40gb")}


def test_the_node_state_marks_pinned_nodes_busy_gpus_and_recent_changes() -> None:
    pinned = a_node(a100(0), a100(1), labels={PIN_LABEL: PIN_VALUE})
    state = node_state(pinned, [gpu_pod("p", (GpuShare("GPU-0"),))], {1: NOW - timedelta(seconds=30)}, NOW)
    assert state is not None and state.pinned
    assert [g.busy for g in state.gpus] == [True, False]
    assert state.gpus[1].changed_s_ago == 30.0
    assert node_state(Node("cpu", 1000, 1000), [], {}, NOW) is None


def test_a_mig_change_lists_only_its_gpus_and_expects_the_resources_of_the_whole_node() -> None:
    node = a_node(a100(0), a100(1), **{"nvidia.com/gpu": 2})
    desired = GpuLayout.mig_geometry([("3g.40gb", 0), ("3g.40gb", 4)])
    plan = LayoutPlan(
        (GpuChange("n0", 1, "A100-80GB", GpuLayout.exclusive(), desired, "2 pods want 3g.40gb"),)
    )
    [change] = node_changes(plan, {"n0": node})
    assert change.kind is ChangeKind.MIG and change.config.startswith("tessera-")
    assert yaml.safe_load(change.body) == [
        {"devices": [1], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}}
    ]
    assert change.expected_resources == {"nvidia.com/gpu": 1, "nvidia.com/mig-3g.40gb": 2}
    assert [(g.index, g.uuid, g.kind, g.mig_profiles) for g in change.gpus] == [
        (1, "GPU-1", "mig", ("3g.40gb", "3g.40gb"))
    ]
    assert change.reason == "2 pods want 3g.40gb"


def test_a_sharing_change_writes_one_device_plugin_config_for_the_node() -> None:
    node = a_node(a100(0), a100(1), **{"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 0})
    sliced = GpuLayout.time_slicing(4)
    plan = LayoutPlan(
        tuple(
            GpuChange("n0", i, "A100-80GB", GpuLayout.exclusive(), sliced, "8 shares of 250") for i in (0, 1)
        )
    )
    [change] = node_changes(plan, {"n0": node})
    assert change.kind is ChangeKind.TIME_SLICING and change.config.startswith("tessera-dp-")
    body = yaml.safe_load(change.body)
    assert body["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
    assert change.expected_resources == {"nvidia.com/gpu": 8, "nvidia.com/mig-1g.10gb": 0}
    assert {g.kind for g in change.gpus} == {"time_slicing"} and SharingMode.TIME_SLICING is sliced.mode
