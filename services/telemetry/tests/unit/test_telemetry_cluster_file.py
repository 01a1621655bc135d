from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from tessera.telemetry.adapters.cluster_file import ClusterFileError, ClusterFileSource, load_cluster_file
from tessera.telemetry.domain.model import inventory_digest


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def test_node_groups_expand_with_stable_gpu_uuids(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
nodes:
  - name_prefix: gpu-
    count: 2
    cpu: "96"
    memory: 1Ti
    gpus: {count: 8, model: A100-80GB}
  - name: cpu-only
""",
    )
    nodes = load_cluster_file(path)
    assert [n.name for n in nodes] == ["gpu-0", "gpu-1", "cpu-only"]
    assert nodes[0].cpu_milli == 96000 and nodes[0].memory_mib == 1024 * 1024
    assert len(nodes[0].gpus) == 8 and nodes[0].gpus[0].memory_mib == 81920
    assert nodes[2].gpus == []
    assert inventory_digest(nodes) == inventory_digest(load_cluster_file(path))
    assert len({g.uuid for n in nodes for g in n.gpus}) == 16


def test_a_bad_cluster_file_stops_the_source_naming_the_field(tmp_path: Path) -> None:
    # The reader's own checks are tested with it, in libs/cluster; here: they reach telemetry.
    with pytest.raises(ClusterFileError, match=r"nodes\[0\]\.gpus\.count"):
        ClusterFileSource(write(tmp_path, "nodes:\n  - {name: a, gpus: {count: 99, model: T4}}"))


async def test_the_file_source_reads_every_gpu(tmp_path: Path) -> None:
    source = ClusterFileSource(write(tmp_path, "nodes:\n  - {name: a, gpus: {count: 2, model: T4}}"))
    readings = await source.read(datetime(2026, 1, 1, tzinfo=UTC))
    assert [(r.node, r.gpu_index) for r in readings] == [("a", 0), ("a", 1)]
