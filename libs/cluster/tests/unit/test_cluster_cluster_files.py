"""Cluster files: the shipped examples, the openb node CSV, and clear errors for bad ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.cluster.cluster_file import ClusterFileError, default_cluster, gpu_uuid, load_cluster

EXAMPLES = Path(__file__).parents[4] / "examples" / "clusters"


def test_dev_4x8_has_four_nodes_of_eight_big_gpus() -> None:
    nodes = load_cluster(EXAMPLES / "dev-4x8.yaml")

    assert [n.name for n in nodes] == [f"gpu-node-{i}" for i in range(4)]
    assert {(n.gpu_model, n.gpu_count, n.gpu_memory_mib) for n in nodes} == {("A100-80GB", 8, 81920)}


def test_the_default_cluster_is_the_dev_4x8_example() -> None:
    assert default_cluster() == load_cluster(EXAMPLES / "dev-4x8.yaml")


def test_the_mixed_example_mixes_models_and_sharing() -> None:
    nodes = {n.name: n for n in load_cluster(EXAMPLES / "mixed.yaml")}

    assert nodes["h100-0"].gpu_model == "H100-80GB"
    assert nodes["a100-mig-0"].labels["nvidia.com/mig.config"] == "all-1g.10gb"
    assert nodes["t4-1"].labels["nvidia.com/device-plugin.config"] == "ts-4"
    assert nodes["cpu-0"].gpu_count == 0


def test_gpu_uuids_are_stable_per_node_and_index() -> None:
    assert gpu_uuid("n", 0) == gpu_uuid("n", 0) != gpu_uuid("n", 1)


def test_the_openb_node_csv_is_a_cluster_file(tmp_path: Path) -> None:
    csv = tmp_path / "nodes.csv"
    csv.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        "openb-node-0000,64000,262144,2,P100\n"
        "openb-node-0227,96000,786432,8,G2\n"
        "openb-node-1200,32000,131072,0,\n"
    )

    nodes = load_cluster(csv, limit=2)

    assert [(n.name, n.gpu_model, n.gpu_count) for n in nodes] == [
        ("openb-node-0000", "P100", 2),
        ("openb-node-0227", "G2", 8),
    ]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("nodes: []\n", "nodes"),
        ("nodes:\n  - {name: a, name_prefix: b}\n", "name_prefix"),
        ("nodes:\n  - {name: a, count: 2}\n", "nodes[0].count"),
        ("nodes:\n  - {name: a, cpu: lots}\n", "nodes[0].cpu"),
        ("nodes:\n  - {name: a, gpus: {count: 2}}\n", "nodes[0].gpus.model"),
        ("nodes:\n  - {name: a, colour: red}\n", "colour"),
        ("nodes:\n  - {name: a}\n  - {name: a}\n", "repeats"),
    ],
)
def test_bad_cluster_files_name_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)

    with pytest.raises(ClusterFileError) as caught:
        load_cluster(path)
    assert field in str(caught.value)
