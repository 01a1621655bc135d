"""Shares on a node slicing time-sliced, with the real scheduler on the devcluster (real Postgres and
NATS): the node's GPU of N replicas takes N fractional pods whose milli sum past 1000, as the device
plugin does; an exclusive GPU beside it keeps counting milli (ADR 0021)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tessera.cluster.builders import PodManifest
from tessera.cluster.conventions import time_slicing_config
from tessera.cluster.conventions.names import (
    DEVICE_PLUGIN_CONFIG_LABEL,
    GPU_ASSIGNMENT_ANNOTATION,
    GPU_REPLICAS_LABEL,
    GPU_SHARING_STRATEGY_LABEL,
    SLICING_DEVICE_PLUGIN_CONFIG_PREFIX,
)
from tessera.core.db.migrations import migrate_all
from tessera.devcluster.apiserver import PODS
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.gpu_operator import DEVICE_PLUGIN_CONFIGMAP, DEVICE_PLUGIN_NAMESPACE
from tessera.scheduler import bootstrap
from tessera.scheduler.config import SchedulerSettings
from tessera.testing.services import eventually, reset_jetstream, running, settings_for

pytestmark = pytest.mark.integration

REPLICAS = 4
MILLI = 600
CONFIG = f"{SLICING_DEVICE_PLUGIN_CONFIG_PREFIX}sched-test"  # a config as slicing names its own
CLUSTER = """
nodes:
  - name: shared-0
    cpu: "32"
    memory: 256Gi
    gpus: {count: 1, model: A100-80GB, memory_mib: 81920}
  - name: plain-0
    cpu: "32"
    memory: 256Gi
    gpus: {count: 1, model: A100-80GB, memory_mib: 81920}
"""


@pytest.fixture
def devcluster(tmp_path: Path) -> Iterator[DevCluster]:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    with DevCluster.from_file(path, speed=20.0) as cluster:
        yield cluster


@pytest.fixture
async def settings(
    nats_url: str, fresh_database: str, devcluster: DevCluster, tmp_path: Path
) -> AsyncIterator[SchedulerSettings]:
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate_all, fresh_database)
    kubeconfig = devcluster.write_kubeconfig(tmp_path / "kubeconfig")
    yield settings_for(SchedulerSettings, nats_url, fresh_database, kubeconfig=kubeconfig, poll_s=0.2)


def time_slice(kubeconfig: Path, node: str, replicas: int) -> None:
    """What slicing's operator writes: its config in the device plugin's ConfigMap, named on the node."""
    with kubernetes.config.new_client_from_config(str(kubeconfig)) as api:  # type: ignore[no-untyped-call]
        core: Any = kubernetes.client.CoreV1Api(api)
        body = {"data": {CONFIG: time_slicing_config(replicas)}}
        core.patch_namespaced_config_map(DEVICE_PLUGIN_CONFIGMAP, DEVICE_PLUGIN_NAMESPACE, body)
        core.patch_node(node, {"metadata": {"labels": {DEVICE_PLUGIN_CONFIG_LABEL: CONFIG}}})


def node_labels(kubeconfig: Path, node: str) -> dict[str, str]:
    with kubernetes.config.new_client_from_config(str(kubeconfig)) as api:  # type: ignore[no-untyped-call]
        found: dict[str, str] = kubernetes.client.CoreV1Api(api).read_node(node).metadata.labels or {}
    return found


def share(name: str) -> dict[str, Any]:
    return (
        PodManifest(name)
        .scheduler()
        .requests(cpu="1", memory="2Gi")
        .gpu_milli(MILLI)
        .annotate("tessera.io/sim-duration", "100000")
        .obj()
    )


def bound(devcluster: DevCluster) -> dict[str, str]:
    items, _ = devcluster.store.list(PODS, "default")
    return {pod["metadata"]["name"]: pod["spec"]["nodeName"] for pod in items if pod["spec"].get("nodeName")}


async def _settled(devcluster: DevCluster, count: int) -> dict[str, str] | None:
    now = bound(devcluster)
    return now if len(now) >= count else None


async def test_a_gpu_time_sliced_into_n_replicas_takes_n_shares_past_1000_milli(
    settings: SchedulerSettings, devcluster: DevCluster
) -> None:
    assert settings.kubeconfig is not None
    kubeconfig = settings.kubeconfig
    await asyncio.to_thread(time_slice, kubeconfig, "shared-0", REPLICAS)

    async def sliced() -> dict[str, str] | None:
        labels = await asyncio.to_thread(node_labels, kubeconfig, "shared-0")
        return labels if labels.get(GPU_REPLICAS_LABEL) == str(REPLICAS) else None

    labels = await eventually(sliced, what="shared-0 time-sliced by the device plugin", timeout=30)
    assert labels[GPU_SHARING_STRATEGY_LABEL] == "time-slicing"

    pods = [f"share-{i}" for i in range(REPLICAS + 2)]
    async with running(bootstrap.build(settings), settings):
        for name in pods:
            devcluster.store.create(PODS, "default", share(name))
        await eventually(lambda: _settled(devcluster, REPLICAS + 1), what="the shares bound", timeout=60)
        await asyncio.sleep(2.0)  # a few more cycles: nothing else may be bound
        placed = bound(devcluster)
    on_shared = sorted(pod for pod, node in placed.items() if node == "shared-0")
    on_plain = sorted(pod for pod, node in placed.items() if node == "plain-0")
    assert len(on_shared) == REPLICAS, f"one pod per replica on the time-sliced GPU, got {placed}"
    assert len(on_plain) == 1, "the exclusive GPU takes one 600-milli share, not two"
    assert len(placed) == REPLICAS + 1, "the last share waits: no replica, no milli left"
    milli_on_shared = 0
    for pod in devcluster.store.list(PODS, "default")[0]:
        if pod["metadata"]["name"] in on_shared:
            assignment = json.loads(pod["metadata"]["annotations"][GPU_ASSIGNMENT_ANNOTATION])
            milli_on_shared += sum(gpu["milli"] for gpu in assignment["gpus"])
    assert milli_on_shared == REPLICAS * MILLI > 1000
