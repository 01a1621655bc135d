"""The PodResources client against the devcluster's per-node gRPC servers (the real proto, over
loopback), and attribution of the devcluster's readings through it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from tessera.cluster.cluster_file import load_cluster
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.devcluster.sim.nvml import DutyCycleTrace
from tessera.telemetry.adapters.attribution import PodResourcesAttributor
from tessera.telemetry.adapters.podresources.client import PodResourcesClient
from tessera.telemetry.adapters.sources.devcluster import DevclusterSource
from tessera.telemetry.domain.attribution import SPLIT_MEMORY, DeviceGrant
from tessera.telemetry.domain.model import SourceUnavailable

pytestmark = pytest.mark.integration

CLUSTER = """
nodes:
  - name_prefix: gpu-node-
    count: 2
    cpu: "64"
    memory: 512Gi
    gpus: {count: 2, model: A100-80GB}
"""


@pytest.fixture
def devcluster(tmp_path: Path) -> Iterator[DevCluster]:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    cluster = DevCluster(
        load_cluster(tmp_path / "cluster.yaml"),
        settings=SimSettings(speed=50, pod_start_seconds=0.05),
        duty_cycle=DutyCycleTrace.synthetic(),
    )
    cluster.start()
    yield cluster
    cluster.stop()


def pod(name: str, node: str, *, milli: int | None = None, profile: str = "training") -> dict[str, object]:
    annotations = {"tessera.io/sim-profile": profile}
    if milli is not None:
        annotations["tessera.io/gpu-milli"] = str(milli)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "annotations": annotations},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "sidecar", "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"},
                {
                    "name": "worker",
                    "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                },
            ],
        },
    }


async def create(url: str, *pods: dict[str, object]) -> None:
    async with httpx.AsyncClient() as http:
        await http.post(f"{url}/api/v1/namespaces", json={"metadata": {"name": "team-a"}})
        for body in pods:
            created = await http.post(f"{url}/api/v1/namespaces/team-a/pods", json=body)
            assert created.status_code == 201, created.text


async def eventually_running(cluster: DevCluster, count: int) -> None:
    for _ in range(200):
        with cluster.ctx.lock:
            if sum(1 for d in cluster.ctx.devices.values() if d.running) >= count:
                return
        await asyncio.sleep(0.02)
    raise AssertionError("the pods did not start")


async def test_list_names_each_containers_gpus_whole_and_shared(devcluster: DevCluster) -> None:
    await create(
        devcluster.url,
        pod("whole", "gpu-node-0"),
        pod("half-a", "gpu-node-0", milli=500, profile="inference"),
        pod("half-b", "gpu-node-0", milli=500, profile="inference"),
    )
    await eventually_running(devcluster, 3)
    endpoints = await DevclusterSource(devcluster.url).podresources_endpoints()
    assert set(endpoints) == {"gpu-node-0", "gpu-node-1"}
    client = PodResourcesClient(endpoints["gpu-node-0"])
    try:
        grants = await client.list()
        raw = await client.list_raw()
    finally:
        await client.close()
    assert {p.name for p in raw.pod_resources} == {"whole", "half-a", "half-b"}
    by_pod = {g.pod: g for g in grants}
    assert by_pod["whole"] == DeviceGrant(
        "team-a", "whole", "worker", "nvidia.com/gpu", by_pod["whole"].device_id
    )
    assert "::" not in by_pod["whole"].device_id
    shared = {by_pod["half-a"].device_id.split("::")[0], by_pod["half-b"].device_id.split("::")[0]}
    assert len(shared) == 1 and shared != {by_pod["whole"].device_id}  # both halves on one other GPU
    assert {by_pod["half-a"].device_id, by_pod["half-b"].device_id} == {
        f"{next(iter(shared))}::0",
        f"{next(iter(shared))}::1",
    }
    # another node's kubelet knows nothing of them
    other = PodResourcesClient(endpoints["gpu-node-1"])
    try:
        assert await other.list() == []
    finally:
        await other.close()


async def test_a_missing_socket_or_a_dead_endpoint_is_unavailable(tmp_path: Path) -> None:
    missing = PodResourcesClient(str(tmp_path / "kubelet.sock"))
    assert missing.socket_missing()
    with pytest.raises(SourceUnavailable, match="does not exist"):
        await missing.list()
    dead = PodResourcesClient("127.0.0.1:1", timeout_s=0.5)
    with pytest.raises(SourceUnavailable, match=r"PodResources at 127\.0\.0\.1:1"):
        await dead.list()
    await dead.close()


async def test_the_devcluster_source_attributes_a_shared_gpu_by_process_memory(
    devcluster: DevCluster,
) -> None:
    await create(
        devcluster.url,
        pod("small", "gpu-node-1", milli=300, profile="inference"),
        pod("large", "gpu-node-1", milli=700, profile="training"),
    )
    await eventually_running(devcluster, 2)
    source = DevclusterSource(devcluster.url)
    attributor = PodResourcesAttributor(source.podresources_endpoints)
    try:
        attributed = await attributor.attribute(await source.read(datetime.now(UTC)))
    finally:
        await attributor.close()
        await source.close()
    assert attributed.fallback_nodes == []
    shares = {s.pod: s for a in attributed.gpus for s in a.shares}
    assert set(shares) == {"small", "large"}
    assert all(s.split == SPLIT_MEMORY and s.container == "worker" for s in shares.values())
    # training fills 85% of its share's memory, inference 60%: the split follows the memory
    assert shares["large"].memory_mib > shares["small"].memory_mib
    gpu = next(a for a in attributed.gpus if a.shares)
    total_used = sum(s.used_gpus for s in shares.values())
    assert total_used == pytest.approx(gpu.reading.utilization_pct / 100)
