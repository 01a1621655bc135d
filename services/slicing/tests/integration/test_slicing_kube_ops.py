"""Slicing's cluster adapter on a devcluster, watched event by event: the patch that names a new MIG
attempt sets `nvidia.com/mig.config.state=pending` with the label, so no read can ever pair this
attempt's name with an earlier attempt's `failed` (or `success`); the simulated MIG manager still
takes it from there to `success`; writing the same attempt again (a step done twice) leaves the state
as the MIG manager set it. A cordon names the operation that made it in the same patch, and an
uncordon removes the name with it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import watch

from tessera.cluster.cluster_file import NodeSpec
from tessera.cluster.conventions import MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL
from tessera.cluster.kube import api_client
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.slicing.adapters.kube import KubeClusterOps
from tessera.slicing.service_layer.ports import CORDONED_BY_ANNOTATION
from tessera.testing.services import eventually

from .conftest import Kube

pytestmark = pytest.mark.integration

NODE = "a100-0"
#: two 7g.80gb instances do not fit an A100-80GB: the MIG manager reports `failed`
TOO_MANY = "- devices: [0]\n  mig-enabled: true\n  mig-devices: {7g.80gb: 2}\n"
ONE_7G = "- devices: [0]\n  mig-enabled: true\n  mig-devices: {7g.80gb: 1}\n"


@pytest.fixture
def devcluster() -> Iterator[DevCluster]:
    nodes = [NodeSpec(NODE, 64_000, 512_000, "A100-80GB", 1, 81920, {})]
    with DevCluster(nodes, settings=SimSettings(speed=1.0, mig_reconfigure_seconds=0.5)) as cluster:
        yield cluster


@pytest.fixture
async def apis(devcluster: DevCluster, tmp_path: Path) -> AsyncIterator[tuple[Kube, KubeClusterOps]]:
    kubeconfig = devcluster.write_kubeconfig(tmp_path / "kubeconfig")
    api = Kube(kubeconfig)
    ops = KubeClusterOps(api_client(kubeconfig=str(kubeconfig)))
    yield api, ops
    await ops.close()
    api.close()


async def _state_is(api: Kube, config: str, state: str) -> bool:
    labels = await api.labels(NODE)
    return labels.get(MIG_CONFIG_LABEL) == config and labels.get(MIG_CONFIG_STATE_LABEL) == state


async def _versions_since(api: Kube, resource_version: str) -> list[Any]:
    """The node after each change since `resource_version`, in order."""

    def read() -> list[Any]:
        events: Any = watch.Watch().stream(
            api.core.list_node,
            field_selector=f"metadata.name={NODE}",
            resource_version=resource_version,
            timeout_seconds=1,
        )
        return [event["object"] for event in events]

    return await asyncio.to_thread(read)


async def _labels_since(api: Kube, resource_version: str) -> list[dict[str, str]]:
    return [dict(node.metadata.labels or {}) for node in await _versions_since(api, resource_version)]


async def test_a_new_attempt_is_labelled_pending_with_its_name_in_one_patch(
    apis: tuple[Kube, KubeClusterOps],
) -> None:
    api, ops = apis
    await ops.write_mig_config(NODE, "tessera-t-1", TOO_MANY)
    await eventually(lambda: _state_is(api, "tessera-t-1", "failed"), timeout=15, what="attempt 1 failed")
    since = (await api.node(NODE)).metadata.resource_version

    await ops.write_mig_config(NODE, "tessera-t-2", ONE_7G)

    await eventually(lambda: _state_is(api, "tessera-t-2", "success"), timeout=15, what="attempt 2 applied")
    seen = [
        labels.get(MIG_CONFIG_STATE_LABEL)
        for labels in await _labels_since(api, since)
        if labels.get(MIG_CONFIG_LABEL) == "tessera-t-2"
    ]
    # the first version of the node that names attempt 2 already says pending, never attempt 1's failed
    assert seen[0] == "pending", seen
    assert "failed" not in seen and seen[-1] == "success", seen
    assert (await api.allocatable(NODE)).get("nvidia.com/mig-7g.80gb") == "1"

    since = (await api.node(NODE)).metadata.resource_version
    await ops.write_mig_config(NODE, "tessera-t-2", ONE_7G)  # the same step again, after a crash
    await asyncio.sleep(0.3)
    assert await _state_is(api, "tessera-t-2", "success")  # the MIG manager will not act again
    assert all(labels.get(MIG_CONFIG_STATE_LABEL) == "success" for labels in await _labels_since(api, since))


async def test_a_cordon_names_its_operation_in_the_same_patch(apis: tuple[Kube, KubeClusterOps]) -> None:
    api, ops = apis
    since = (await api.node(NODE)).metadata.resource_version

    await ops.cordon(NODE, True, "op-1")
    node = await api.node(NODE)
    assert node.spec.unschedulable and node.metadata.annotations[CORDONED_BY_ANNOTATION] == "op-1"
    await ops.cordon(NODE, False, "op-1")
    node = await api.node(NODE)
    assert not node.spec.unschedulable
    assert CORDONED_BY_ANNOTATION not in (node.metadata.annotations or {})

    versions = await _versions_since(api, since)
    assert len(versions) >= 2
    for version in versions:  # never one without the other
        named = CORDONED_BY_ANNOTATION in (version.metadata.annotations or {})
        assert bool(version.spec.unschedulable) == named
