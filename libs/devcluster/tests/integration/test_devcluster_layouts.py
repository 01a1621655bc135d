"""`tessera devcluster layout`'s table: each GPU's layout as the simulated GPU Operator publishes it,
exclusive, MIG instances (per device), time-sliced, and the config labels beside it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tessera.cluster.cluster_file import NodeSpec
from tessera.cluster.conventions import DEVICE_PLUGIN_CONFIG_LABEL, MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL
from tessera.devcluster.apiserver import NODES
from tessera.devcluster.layouts import gpu_rows, render
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.devcluster.sim.nvml import DutyCycleTrace

pytestmark = pytest.mark.integration


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    nodes = [
        NodeSpec("a100-0", 64_000, 512_000, "A100-80GB", 2, 81920, {}),
        NodeSpec("a100-1", 64_000, 512_000, "A100-80GB", 1, 81920, {}),
        NodeSpec("cpu-0", 8_000, 32_000),
    ]
    settings = SimSettings(speed=50.0, mig_reconfigure_seconds=1.0)
    async with DevCluster(nodes, settings=settings, duty_cycle=DutyCycleTrace.synthetic()) as running:
        yield running


def label(cluster: DevCluster, node: str, key: str, value: str) -> None:
    cluster.store.patch(
        NODES, None, node, {"metadata": {"labels": {key: value}}}, "application/merge-patch+json"
    )


async def test_each_gpu_shows_its_layout_and_the_labels_that_chose_it(cluster: DevCluster) -> None:
    label(cluster, "a100-0", MIG_CONFIG_LABEL, "all-3g.40gb")
    label(cluster, "a100-1", DEVICE_PLUGIN_CONFIG_LABEL, "ts-4")
    for _ in range(500):
        labels = cluster.store.get(NODES, None, "a100-0")["metadata"]["labels"]
        if labels.get(MIG_CONFIG_STATE_LABEL) == "success":
            break
        await asyncio.sleep(0.02)
    nodes, _ = cluster.store.list(NODES, None)
    rows = gpu_rows(nodes)
    assert [(r.node, r.index, r.layout) for r in rows] == [
        ("a100-0", 0, "mig: 3g.40gb@0, 3g.40gb@4"),
        ("a100-0", 1, "mig: 3g.40gb@0, 3g.40gb@4"),
        ("a100-1", 0, "time-slicing x4"),
    ]
    assert (rows[0].mig_config, rows[0].mig_state, rows[2].device_plugin_config) == (
        "all-3g.40gb",
        "success",
        "ts-4",
    )
    table = render(rows).splitlines()
    assert table[0].split() == [
        "NODE",
        "GPU",
        "MODEL",
        "LAYOUT",
        "HEALTH",
        "MIG.CONFIG",
        "STATE",
        "DEVICE-PLUGIN.CONFIG",
    ]
    assert table[3].split()[:4] == ["a100-1", "0", "A100-80GB", "time-slicing"]
