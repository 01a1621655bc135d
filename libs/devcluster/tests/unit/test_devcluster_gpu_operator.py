"""The simulated GPU Operator, and what Tessera's own parsers read back from its nodes."""

from __future__ import annotations

import pytest

from tessera.cluster.catalogue import resolve_product
from tessera.cluster.cluster_file import NodeSpec
from tessera.cluster.conventions import parse_node, time_slicing_config
from tessera.cluster.domain.node import MigConfigState
from tessera.devcluster.apiserver.resources import NODES
from tessera.devcluster.apiserver.store import ObjectStore
from tessera.devcluster.sim import gpu_operator
from tessera.devcluster.sim.context import SimContext, SimSettings
from tessera.devcluster.sim.operator_controller import GpuOperator
from tessera.devcluster.sim.state import SimNode


def sim_node(model: str = "A100-80GB", count: int = 8, **labels: str) -> SimNode:
    return SimNode.from_spec(NodeSpec("n0", 96_000, 1_048_576, model, count, 81920, labels), 0)


@pytest.mark.parametrize(
    ("replicas", "broken", "expected"),
    [
        (1, set(), {"nvidia.com/gpu": 8}),
        (4, set(), {"nvidia.com/gpu": 32}),
        (1, {2}, {"nvidia.com/gpu": 7}),
        (2, {0, 1}, {"nvidia.com/gpu": 12}),
    ],
)
def test_the_device_plugin_advertises_healthy_gpus_times_replicas(
    replicas: int, broken: set[int], expected: dict[str, int]
) -> None:
    node = sim_node()
    for index in broken:
        node.gpus[index].xids.append(79)

    assert gpu_operator.advertised_resources(node.gpus, replicas) == expected


def test_benign_xids_leave_the_gpu_allocatable() -> None:
    node = sim_node()
    node.gpus[0].xids.append(13)

    assert gpu_operator.advertised_resources(node.gpus, 1) == {"nvidia.com/gpu": 8}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("all-1g.10gb", {"nvidia.com/mig-1g.10gb": 56, "nvidia.com/gpu": 0}),
        ("all-3g.40gb", {"nvidia.com/mig-3g.40gb": 16, "nvidia.com/gpu": 0}),
        (
            "all-balanced",
            {
                "nvidia.com/mig-1g.10gb": 16,
                "nvidia.com/mig-2g.20gb": 8,
                "nvidia.com/mig-3g.40gb": 8,
                "nvidia.com/gpu": 0,
            },
        ),
        ("all-disabled", {"nvidia.com/gpu": 8}),
    ],
)
def test_mig_layouts_become_mig_resources(config: str, expected: dict[str, int]) -> None:
    node = sim_node()
    for gpu, (enabled, instances) in zip(node.gpus, gpu_operator.mig_layout(node, config), strict=True):
        gpu.mig_enabled, gpu.mig_instances = enabled, instances

    assert gpu_operator.advertised_resources(node.gpus, 1) == expected


def test_a_mig_config_for_a_gpu_without_mig_does_not_apply() -> None:
    assert gpu_operator.validate_mig_config(sim_node("T4", 4), "all-1g.10gb") is not None
    assert gpu_operator.validate_mig_config(sim_node(), "all-1g.10gb") is None


@pytest.mark.parametrize(
    ("label", "data", "replicas"),
    [
        (None, None, 1),
        ("ts-4", {"ts-4": time_slicing_config(4)}, 4),
        ("ts-4", {"default": "version: v1\n"}, 1),  # a config the ConfigMap lacks: no sharing
        (None, {"default": time_slicing_config(2)}, 2),
    ],
)
def test_the_node_label_picks_the_device_plugin_config(
    label: str | None, data: dict[str, str] | None, replicas: int
) -> None:
    labels = {"nvidia.com/device-plugin.config": label} if label else {}
    assert gpu_operator.replicas_for(labels, data) == replicas


@pytest.mark.parametrize("model", sorted(gpu_operator.PRODUCTS))
def test_product_labels_resolve_back_to_the_catalogue_model(model: str) -> None:
    assert resolve_product(gpu_operator.product_label(model, shared=False)).name == model
    assert resolve_product(gpu_operator.product_label(model, shared=True)).name == model


def test_tessera_parses_a_devcluster_node_with_its_mig_layout() -> None:
    store = ObjectStore()
    nodes = {"n0": sim_node(**{"nvidia.com/mig.config": "all-balanced"})}
    GpuOperator(SimContext(store, SimSettings(), nodes)).install()

    parsed = parse_node(store.get(NODES, None, "n0"))

    assert len(parsed.gpus) == 8
    assert parsed.mig_config == "all-balanced" and parsed.mig_config_state is MigConfigState.SUCCESS
    assert all(sorted(g.mig_profiles) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"] for g in parsed.gpus)
    assert parsed.extended_allocatable["nvidia.com/mig-1g.10gb"] == 16
    assert [g.uuid for g in parsed.gpus] == [nodes["n0"].gpus[i].uuid for i in range(8)]
