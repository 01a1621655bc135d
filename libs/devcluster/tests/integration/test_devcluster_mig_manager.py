"""The simulated MIG manager and device plugin, as slicing drives them: named per-device configs from
the MIG manager's ConfigMap, operands paused while it works, refusals for a busy GPU or a geometry the
model cannot take, and MPS replicas re-advertised by the device plugin."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import yaml

from tessera.cluster.builders import PodManifest
from tessera.cluster.cluster_file import NodeSpec
from tessera.cluster.conventions import DEVICE_PLUGIN_CONFIG_LABEL, MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL
from tessera.devcluster.apiserver import CONFIGMAPS, NODES, PODS, Selector
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.devcluster.sim.gpu_operator import DEVICE_PLUGIN_NAMESPACE, OPERAND_LABELS, PAUSED_FOR_MIG_CHANGE
from tessera.devcluster.sim.mig_parted import MIG_PARTED_CONFIGMAP, MIG_PARTED_KEY
from tessera.devcluster.sim.nvml import DutyCycleTrace

pytestmark = pytest.mark.integration

FAST = SimSettings(speed=50.0, pod_start_seconds=1.0, mig_reconfigure_seconds=5.0)


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    nodes = [NodeSpec("a100-0", 96_000, 1_048_576, "A100-80GB", 4, 81920, {})]
    async with DevCluster(nodes, settings=FAST, duty_cycle=DutyCycleTrace.synthetic()) as running:
        yield running


async def eventually(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (value := check()):
        if loop.time() > deadline:
            pytest.fail(f"condition never held; last value: {value!r}")
        await asyncio.sleep(0.02)
    return value


def write_mig_configs(cluster: DevCluster, configs: dict[str, list[dict[str, Any]]]) -> None:
    configmap = cluster.store.get(CONFIGMAPS, DEVICE_PLUGIN_NAMESPACE, MIG_PARTED_CONFIGMAP)
    configmap["data"][MIG_PARTED_KEY] = yaml.safe_dump({"version": "v1", "mig-configs": configs})
    cluster.store.replace(CONFIGMAPS, DEVICE_PLUGIN_NAMESPACE, MIG_PARTED_CONFIGMAP, configmap)


def label(cluster: DevCluster, key: str, value: str) -> None:
    cluster.store.patch(
        NODES, None, "a100-0", {"metadata": {"labels": {key: value}}}, "application/merge-patch+json"
    )


def labels(cluster: DevCluster) -> dict[str, str]:
    return dict(cluster.store.get(NODES, None, "a100-0")["metadata"]["labels"])


def allocatable(cluster: DevCluster) -> dict[str, str]:
    return dict(cluster.store.get(NODES, None, "a100-0")["status"]["allocatable"])


async def test_a_per_device_config_changes_only_its_gpus_and_pauses_operands_meanwhile(
    cluster: DevCluster,
) -> None:
    cluster.store.create(PODS, "default", PodManifest("busy").scheduler().gpus(1).obj())
    cluster.store.bind("default", "busy", "a100-0")  # holds GPU 0, which the config leaves alone
    await eventually(lambda: cluster.store.get(PODS, "default", "busy")["status"]["phase"] == "Running")
    write_mig_configs(
        cluster, {"tessera-one": [{"devices": [1], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}}]}
    )
    watch = cluster.store.watch(NODES, selector=Selector.parse(None, "metadata.name=a100-0"))
    label(cluster, MIG_CONFIG_LABEL, "tessera-one")
    seen: list[tuple[str | None, str | None, str | None]] = []
    while not seen or seen[-1][0] != "success":
        event = await asyncio.wait_for(watch.next(), 20)
        assert event is not None
        obj_labels = event["object"]["metadata"]["labels"]
        state = (
            obj_labels.get(MIG_CONFIG_STATE_LABEL),
            obj_labels.get(OPERAND_LABELS[0]),
            event["object"]["status"]["allocatable"].get("nvidia.com/gpu"),
        )
        if not seen or seen[-1] != state:
            seen.append(state)
    watch.close()
    assert seen[-2:] == [("pending", PAUSED_FOR_MIG_CHANGE, None), ("success", "true", "3")]
    assert allocatable(cluster)["nvidia.com/mig-3g.40gb"] == "2"
    assert all(labels(cluster)[key] == "true" for key in OPERAND_LABELS)


async def test_a_per_device_config_on_a_busy_gpu_fails_and_changes_nothing(cluster: DevCluster) -> None:
    cluster.store.create(PODS, "default", PodManifest("busy").scheduler().gpus(1).obj())
    cluster.store.bind("default", "busy", "a100-0")
    await eventually(lambda: cluster.store.get(PODS, "default", "busy")["status"]["phase"] == "Running")
    write_mig_configs(
        cluster, {"on-zero": [{"devices": [0], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}}]}
    )
    label(cluster, MIG_CONFIG_LABEL, "on-zero")
    await eventually(lambda: labels(cluster).get(MIG_CONFIG_STATE_LABEL) == "failed")
    assert allocatable(cluster)["nvidia.com/gpu"] == "4"


async def test_a_geometry_the_model_cannot_take_fails(cluster: DevCluster) -> None:
    # three 3g.40gb need 12 compute slices; an A100 has 7
    write_mig_configs(
        cluster, {"too-big": [{"devices": [2], "mig-enabled": True, "mig-devices": {"3g.40gb": 3}}]}
    )
    label(cluster, MIG_CONFIG_LABEL, "too-big")
    await eventually(lambda: labels(cluster).get(MIG_CONFIG_STATE_LABEL) == "failed")
    write_mig_configs(
        cluster, {"h100-only": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.12gb": 7}}]}
    )
    label(cluster, MIG_CONFIG_LABEL, "h100-only")
    await eventually(lambda: labels(cluster).get(MIG_CONFIG_LABEL) == "h100-only")
    await eventually(lambda: labels(cluster).get(MIG_CONFIG_STATE_LABEL) == "failed")
    assert allocatable(cluster)["nvidia.com/gpu"] == "4"


async def test_the_device_plugin_re_advertises_mps_replicas(cluster: DevCluster) -> None:
    configmap = cluster.store.get(CONFIGMAPS, DEVICE_PLUGIN_NAMESPACE, "device-plugin-config")
    configmap["data"]["mps-3"] = yaml.safe_dump(
        {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 3}]}}}
    )
    cluster.store.replace(CONFIGMAPS, DEVICE_PLUGIN_NAMESPACE, "device-plugin-config", configmap)
    label(cluster, DEVICE_PLUGIN_CONFIG_LABEL, "mps-3")
    await eventually(lambda: allocatable(cluster)["nvidia.com/gpu"] == "12")
    assert labels(cluster)["nvidia.com/gpu.sharing-strategy"] == "mps"
