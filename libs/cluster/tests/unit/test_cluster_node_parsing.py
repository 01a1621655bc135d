"""Nodes: from GPU Operator labels, from Tessera's inventory annotations, and back to a manifest."""

from __future__ import annotations

import pytest

from tessera.cluster.builders import gfd_node_manifest
from tessera.cluster.catalogue import nvswitch_board, pcie_board
from tessera.cluster.conventions import node_manifest, parse_node
from tessera.cluster.domain import (
    Gpu,
    GpuHealth,
    Link,
    MigConfigState,
    MigInstance,
    MigMode,
    MigStrategy,
    Node,
    Taint,
    TaintEffect,
    Toleration,
    TolerationOperator,
)


def test_gfd_labels_give_gpus_with_stable_uuids_and_a_typical_board() -> None:
    node = parse_node(gfd_node_manifest("gpu-1", "NVIDIA-H100-80GB-HBM3", 8, 81559))
    assert node.gpu_count == 8
    assert {g.model for g in node.gpus} == {"H100-80GB"}
    assert node.gpus[3].uuid == "GPU-gpu-1-3"
    assert node.gpus[0].memory_mib == 81559
    assert node.interconnect == nvswitch_board(8)
    assert node.allocatable_cpu_milli == 64000
    assert node.allocatable_memory_mib == 512 * 1024
    assert node.extended_allocatable == {"nvidia.com/gpu": 8}


def test_unknown_product_keeps_its_name_and_memory() -> None:
    node = parse_node(gfd_node_manifest("g", "G2", 4, 16000))
    assert node.gpus[0].model == "G2"
    assert node.gpus[0].memory_mib == 16000
    assert node.interconnect is not None
    assert node.interconnect.link(0, 1) is Link.PCIE_SWITCH


def test_applied_mig_config_lays_out_each_gpu() -> None:
    labels = {
        "nvidia.com/mig.config": "all-balanced",
        "nvidia.com/mig.config.state": "success",
        "nvidia.com/mig.strategy": "mixed",
    }
    node = parse_node(gfd_node_manifest("m", "NVIDIA-A100-SXM4-80GB", 2, 81920, labels=labels))
    assert node.mig_strategy is MigStrategy.MIXED
    assert node.mig_config_state is MigConfigState.SUCCESS
    for gpu in node.gpus:
        assert gpu.mig_mode is MigMode.ENABLED
        assert sorted(gpu.mig_profiles) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]


def test_pending_mig_config_is_not_taken_as_applied() -> None:
    labels = {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "pending"}
    node = parse_node(gfd_node_manifest("m", "NVIDIA-A100-SXM4-80GB", 1, 81920, labels=labels))
    assert node.mig_config == "all-1g.10gb"
    assert node.mig_config_state is MigConfigState.PENDING
    assert node.gpus[0].mig_instances == ()


def test_node_spec_taints_cordon_and_readiness() -> None:
    obj = gfd_node_manifest("n", "Tesla-T4", 1, 15360, labels={"nvidia.com/gpu.replicas": "4"})
    obj["spec"] = {"unschedulable": True, "taints": [{"key": "gpu", "value": "t4", "effect": "NoSchedule"}]}
    obj["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    node = parse_node(obj)
    assert node.unschedulable
    assert not node.ready
    assert node.taints == (Taint("gpu", TaintEffect.NO_SCHEDULE, "t4"),)
    assert node.gpu_replicas == 4
    assert not node.tolerated_by(())
    assert node.tolerated_by((Toleration("gpu", TolerationOperator.EQUAL, "t4"),))


@pytest.mark.parametrize(
    ("patch", "reason"),
    [
        (
            {"nvidia.com/mig.config.state": "maybe"},
            r"mig\.config\.state.*pending, rebooting, success, failed",
        ),
        ({"nvidia.com/mig.strategy": "half"}, r"mig\.strategy"),
        ({"nvidia.com/gpu.count": "two"}, r"gpu\.count"),
    ],
)
def test_malformed_labels_name_the_field(patch: dict[str, str], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_node(gfd_node_manifest("n", "Tesla-T4", 1, 15360, labels=patch))


def test_manifest_round_trips_a_node_with_inventory_and_topology() -> None:
    node = Node(
        name="gpu-9",
        allocatable_cpu_milli=32000,
        allocatable_memory_mib=256 * 1024,
        gpus=(
            Gpu(
                0,
                "GPU-0",
                "A100-80GB",
                81920,
                mig_mode=MigMode.ENABLED,
                mig_instances=(MigInstance("7g.80gb", 0),),
            ),
            Gpu(1, "GPU-1", "A100-80GB", 81920, health=GpuHealth.UNHEALTHY, numa_node=1),
        ),
        labels={"pool": "a"},
        taints=(Taint("dedicated", TaintEffect.NO_EXECUTE, "x"),),
        interconnect=pcie_board(2, nvlink_bridge_pairs=True, numa_nodes=1),
        mig_strategy=MigStrategy.MIXED,
        mig_config="custom",
        mig_config_state=MigConfigState.SUCCESS,
        gpu_replicas=2,
        extended_allocatable={"nvidia.com/gpu": 1, "nvidia.com/mig-7g.80gb": 1},
    )
    parsed = parse_node(node_manifest(node))
    assert parsed.gpus == node.gpus
    assert parsed.interconnect == node.interconnect
    assert parsed.taints == node.taints
    assert (parsed.mig_strategy, parsed.mig_config, parsed.mig_config_state) == (
        MigStrategy.MIXED,
        "custom",
        MigConfigState.SUCCESS,
    )
    assert parsed.gpu_replicas == 2
    assert parsed.extended_allocatable == node.extended_allocatable
    assert (parsed.allocatable_cpu_milli, parsed.allocatable_memory_mib) == (32000, 256 * 1024)
    assert parsed.labels["pool"] == "a"


def test_domain_objects_refuse_inconsistent_values() -> None:
    with pytest.raises(ValueError, match="duplicate GPU index"):
        Node("n", 1, 1, gpus=(Gpu(0, "a", "T4", 1), Gpu(0, "b", "T4", 1)))
    with pytest.raises(ValueError, match="MIG is disabled"):
        Gpu(0, "a", "A30", 1, mig_instances=(MigInstance("4g.24gb", 0),))
    with pytest.raises(ValueError, match="too small"):
        Node("n", 1, 1, gpus=(Gpu(2, "a", "T4", 1),), interconnect=pcie_board(2))


def test_single_strategy_labels_describe_mig_devices_and_are_turned_back_into_gpus() -> None:
    labels = {"nvidia.com/mig.strategy": "single"}
    obj = gfd_node_manifest("s", "A100-SXM4-40GB-MIG-1g.5gb", 56, 4864, labels=labels)
    node = parse_node(obj)
    assert node.gpu_count == 8
    assert node.mig_strategy is MigStrategy.SINGLE
    for gpu in node.gpus:
        assert gpu.model == "A100-40GB"
        assert gpu.memory_mib == 40 * 1024
        assert gpu.mig_profiles == ("1g.5gb",) * 7


def test_single_strategy_with_an_applied_config_uses_its_layout() -> None:
    labels = {
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/mig.config": "all-3g.40gb",
        "nvidia.com/mig.config.state": "success",
    }
    node = parse_node(gfd_node_manifest("s", "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb", 16, 40192, labels=labels))
    assert node.gpu_count == 8
    assert {gpu.mig_profiles for gpu in node.gpus} == {("3g.40gb", "3g.40gb")}


def test_time_sliced_capacity_is_divided_back_into_physical_gpus() -> None:
    obj = gfd_node_manifest("t", "Tesla-T4-SHARED", 4, 15360, labels={"nvidia.com/gpu.replicas": "4"})
    del obj["metadata"]["labels"]["nvidia.com/gpu.count"]
    obj["status"]["capacity"]["nvidia.com/gpu"] = "16"
    node = parse_node(obj)
    assert (node.gpu_count, node.gpu_replicas, node.gpus[0].model) == (4, 4, "T4")


def test_bad_replica_label_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"gpu\.replicas"):
        parse_node(gfd_node_manifest("t", "Tesla-T4", 1, 15360, labels={"nvidia.com/gpu.replicas": "many"}))


def test_gpu_node_builder_is_deterministic_and_survives_a_manifest_round_trip() -> None:
    from tessera.cluster.builders import gpu_node

    node = gpu_node("gpu-7", "A100-80GB", 8, mig_config="all-balanced")
    assert node == gpu_node("gpu-7", "A100-80GB", 8, mig_config="all-balanced")
    assert node.gpus[0].uuid.startswith("GPU-") and node.gpus[0].uuid != node.gpus[1].uuid
    assert node.extended_allocatable == {
        "nvidia.com/mig-1g.10gb": 16,
        "nvidia.com/mig-2g.20gb": 8,
        "nvidia.com/mig-3g.40gb": 8,
    }
    assert all(i.uuid and i.uuid.startswith("MIG-") for i in node.gpus[0].mig_instances)
    parsed = parse_node(node_manifest(node))
    assert parsed.gpus == node.gpus
    assert parsed.interconnect == nvswitch_board(8)
    assert parsed.extended_allocatable == node.extended_allocatable
    shared = gpu_node("t4", "T4", 2, replicas=4)
    assert shared.extended_allocatable == {"nvidia.com/gpu": 8}
    assert parse_node(node_manifest(shared)).gpu_replicas == 4
