"""The cache on the Kubernetes adapter, against the devcluster's emulated API server, when the
cluster holds objects Tessera cannot parse (legal to Kubernetes, unexpected to Tessera)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tessera.cluster.cache import ClusterCache
from tessera.cluster.domain import MigConfigState, Node
from tessera.cluster.kube import KubernetesCluster, api_client
from tessera.cluster.port import EventType, Listing
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.apiserver.resources import NODES

pytestmark = pytest.mark.integration


def _node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "status": {
            "allocatable": {"cpu": "8", "memory": "32Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _label(key: str, value: str) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        obj["metadata"].setdefault("labels", {})[key] = value

    return change


@pytest.fixture
async def served() -> AsyncIterator[tuple[ApiServer, ClusterCache]]:
    async with ApiServer(history=1000) as server:
        kube = KubernetesCluster(api_client(url=server.url), watch_timeout_seconds=60)
        try:
            server.store.create(NODES, None, _node("a"))
            server.store.create(NODES, None, _node("b"))
            async with ClusterCache(kube, track_bound=False) as cache:
                yield server, cache
        finally:
            await kube.close()


@pytest.mark.parametrize("value", ["Infinity", "NaN", "-inf", "1e999999999"])
async def test_a_non_finite_quantity_label_does_not_stop_the_node_watch(
    served: tuple[ApiServer, ClusterCache], value: str
) -> None:
    server, cache = served
    server.store.mutate(NODES, None, "b", _label("nvidia.com/gpu.count", value))
    server.store.create(NODES, None, _node("c"))
    await cache.nodes.wait_for(lambda nodes: "c" in nodes, timeout=5)
    task = next(t for t in cache._tasks if t.get_name() == "reflector-nodes")
    assert not task.done()


async def test_a_node_the_mig_manager_reboots_is_seen_not_ready(
    served: tuple[ApiServer, ClusterCache],
) -> None:
    server, cache = served

    def rebooting(obj: dict[str, Any]) -> None:
        obj["metadata"]["labels"]["nvidia.com/mig.config.state"] = "rebooting"
        obj["status"]["conditions"] = [{"type": "Ready", "status": "False"}]

    server.store.mutate(NODES, None, "a", rebooting)
    await cache.nodes.wait_for(lambda nodes: "a" in nodes and not nodes["a"].ready, timeout=5)
    assert cache.nodes.store["a"].mig_config_state is MigConfigState.REBOOTING


async def test_a_node_that_stops_parsing_leaves_the_cache_as_a_relist_would_leave_it(
    served: tuple[ApiServer, ClusterCache],
) -> None:
    server, cache = served
    seen: list[tuple[EventType, str]] = []
    cache.nodes.subscribe(lambda event: seen.append((event.type, event.object.name)))
    server.store.mutate(NODES, None, "a", _label("nvidia.com/mig.config.state", "maybe"))
    await cache.nodes.wait_for(lambda nodes: "a" not in nodes, timeout=5)
    assert seen == [(EventType.DELETED, "a")]
    assert set(cache.nodes.store) == {n.name for n in (await cache_listing(server)).items}
    # Readable again: back in the cache.
    server.store.mutate(NODES, None, "a", _label("nvidia.com/mig.config.state", "success"))
    await cache.nodes.wait_for(lambda nodes: "a" in nodes, timeout=5)
    assert seen[-1] == (EventType.ADDED, "a")


async def cache_listing(server: ApiServer) -> Listing[Node]:
    kube = KubernetesCluster(api_client(url=server.url))
    try:
        return await kube.list_nodes()
    finally:
        await kube.close()
