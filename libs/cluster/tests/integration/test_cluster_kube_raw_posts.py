"""Binds and evictions are POSTed as the client's generated methods would send them, without them:
those validate the body into the client's model and serialise it back, more CPU than the request."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s

from tessera.cluster.domain import PodRef
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.kube import KubernetesCluster, api_client
from tessera.cluster.port import AlreadyBound, NotFound
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.apiserver.resources import NODES, PODS

pytestmark = pytest.mark.integration


def _refused(*_: Any, **__: Any) -> Any:
    raise AssertionError("the client's generated method was called")


async def test_bind_and_evict_post_without_the_generated_methods(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(k8s.CoreV1Api, "create_namespaced_pod_binding", _refused)
    monkeypatch.setattr(k8s.CoreV1Api, "create_namespaced_pod_eviction", _refused)
    async with ApiServer() as server:
        server.store.create(NODES, None, {"metadata": {"name": "n1"}})
        for name in ("a", "b"):
            server.store.create(
                PODS, "ns", {"metadata": {"name": name}, "spec": {"containers": [{"name": "c"}]}}
            )
        cluster = KubernetesCluster(api_client(url=server.url))
        try:
            assignment = DeviceAssignment("n1", (GpuShare("GPU-1", 500),))
            await cluster.bind(PodRef("ns", "a"), "n1", assignment)
            with pytest.raises(AlreadyBound):
                await cluster.bind(PodRef("ns", "a"), "n1")
            with pytest.raises(NotFound):
                await cluster.bind(PodRef("ns", "gone"), "n1")
            await cluster.evict(PodRef("ns", "b"), grace_period_seconds=0)
            with pytest.raises(NotFound):
                await cluster.evict(PodRef("ns", "gone"))
        finally:
            await cluster.close()

        bound = server.store.get(PODS, "ns", "a")
        assert bound["spec"]["nodeName"] == "n1"
        assert "tessera.io/gpu-assignment" in bound["metadata"]["annotations"]
        with pytest.raises(Exception, match="not found"):
            server.store.get(PODS, "ns", "b")
