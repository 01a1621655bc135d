"""`tessera devcluster layout` against a running devcluster: a row per GPU with its current layout."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tessera.cli.devcluster import app
from tessera.cluster.cluster_file import NodeSpec
from tessera.devcluster.runner import DevCluster

pytestmark = pytest.mark.integration


def test_layout_prints_a_row_per_gpu(tmp_path: Path) -> None:
    nodes = [
        NodeSpec("h100-0", 64_000, 512_000, "H100-80GB", 2, 81920, {"nvidia.com/mig.config": "all-1g.10gb"})
    ]
    with DevCluster(nodes) as cluster:
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        result = CliRunner().invoke(app, ["layout", "--kubeconfig", str(kubeconfig)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    header, *rows = result.output.splitlines()
    assert header.split()[:4] == ["NODE", "GPU", "MODEL", "LAYOUT"]
    assert [row.split()[:4] for row in rows] == [["h100-0", str(i), "H100-80GB", "mig:"] for i in range(2)]
    assert all("1g.10gb@6" in row and "all-1g.10gb" in row and "success" in row for row in rows)
