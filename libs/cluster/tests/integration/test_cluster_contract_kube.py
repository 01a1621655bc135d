"""The Cluster contract on the Kubernetes adapter, against the devcluster's emulated API server."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import pytest

from tessera.cluster.contract import CHECKS, ClusterHarness
from tessera.cluster.domain import PodRef
from tessera.cluster.kube import KubernetesCluster, api_client
from tessera.cluster.port import Cluster
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.apiserver.resources import CONFIGMAPS, NODES, PODGROUPS, PODS

HISTORY = 64


class ApiServerHarness:
    """Acts as "someone else" by writing to the emulated server's store directly."""

    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self.kube = KubernetesCluster(api_client(url=server.url), watch_timeout_seconds=60)
        self.cluster: Cluster = self.kube

    async def add_node(self, manifest: dict[str, Any]) -> None:
        self.server.store.create(NODES, None, manifest)

    async def add_pod(self, manifest: dict[str, Any]) -> None:
        self.server.store.create(PODS, manifest["metadata"]["namespace"], manifest)

    async def add_pod_group(self, manifest: dict[str, Any]) -> None:
        self.server.store.create(PODGROUPS, manifest["metadata"]["namespace"], manifest)

    async def delete_pod(self, ref: PodRef) -> None:
        self.server.store.delete(PODS, ref.namespace, ref.name)

    async def write_config_map(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        self.server.store.mutate(CONFIGMAPS, namespace, name, _set_data(dict(data)))

    async def end_watches(self) -> None:
        self.server.store.close_watches()

    async def expire_history(self) -> None:
        # Push every event seen so far out of the server's bounded history.
        self.server.store.create(CONFIGMAPS, "kube-system", {"metadata": {"name": "churn"}, "data": {}})
        for i in range(HISTORY):
            self.server.store.mutate(CONFIGMAPS, "kube-system", "churn", _set_data({"i": str(i)}))


def _set_data(data: dict[str, str]) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        obj["data"] = data

    return change


@pytest.fixture
async def harness() -> AsyncIterator[ApiServerHarness]:
    async with ApiServer(history=HISTORY) as server:
        harness = ApiServerHarness(server)
        try:
            yield harness
        finally:
            await harness.kube.close()
    # Every watch stream's thread must have ended with its consumer: none may linger on a socket.
    for thread in threading.enumerate():
        if thread.name.startswith("watch-"):
            await asyncio.to_thread(thread.join, 10)
            assert not thread.is_alive(), f"{thread.name} outlived its watch"


@pytest.mark.integration
@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
async def test_kubernetes_adapter_honours_the_contract(
    harness: ClusterHarness, check: Callable[[ClusterHarness], Awaitable[None]]
) -> None:
    await check(harness)
