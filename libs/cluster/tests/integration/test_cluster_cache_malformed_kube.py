"""The cache on the Kubernetes adapter, against the devcluster's emulated API server, when the
cluster holds objects Tessera cannot parse (legal to Kubernetes, unexpected to Tessera)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tessera.cluster.cache import ClusterCache
from tessera.cluster.kube import KubernetesCluster, api_client
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
