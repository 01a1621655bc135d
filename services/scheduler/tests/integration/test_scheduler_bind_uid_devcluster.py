"""The scheduler's bind names the pod's uid in the Binding, against the devcluster's API server
through the official client: a pod made again under the same name (as LeaderWorkerSet workers are)
while the watches still show the one before is not bound with the assignment written for that one.

Before, the Binding named the pod alone: the new pod was bound, its annotation naming the old uid."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tessera.cluster.builders import PodManifest
from tessera.cluster.domain.requirements import PodRef
from tessera.cluster.kube import KubernetesCluster, api_client
from tessera.devcluster.apiserver import PODS, ApiServer
from tessera.scheduler.adapters.kube import ClusterBinder, Evictions
from tessera.scheduler.domain.plugins.reserve import BindError
from tessera.scheduler.domain.snapshot import Allocation
from tessera.scheduler.service_layer.bound_pods import our_bind

pytestmark = pytest.mark.integration

REF = PodRef("default", "w0")
PLACED = Allocation("default/w0", "g", "gpu-a", ((0, 1000),), 1000, 1024)


@pytest.fixture
async def server() -> AsyncIterator[ApiServer]:
    async with ApiServer() as server:
        yield server


def manifest() -> dict[str, object]:
    return PodManifest("w0").scheduler().requests(cpu="1", memory="1Gi").gpus(1).obj()


async def test_a_pod_made_again_under_its_name_is_not_bound_with_the_old_uid(server: ApiServer) -> None:
    cluster = KubernetesCluster(api_client(url=server.url))
    try:
        server.store.create(PODS, "default", manifest())
        before = (await cluster.get_pod(REF)).uid
        server.store.delete(PODS, "default", "w0")
        server.store.create(PODS, "default", manifest())  # its controller makes it again
        now = (await cluster.get_pod(REF)).uid
        assert before and now and before != now
        uids = {"uid": before}  # what the watches show: the pod before
        port = ClusterBinder(
            cluster,
            asyncio.get_running_loop(),
            lambda node: {0: "GPU-a0"},
            timeout_s=10,
            evictions=Evictions(uid_of=lambda _: uids["uid"]),
        )

        with pytest.raises(BindError, match="Precondition failed"):
            await asyncio.to_thread(port.bind, PLACED)
        pod = await cluster.get_pod(REF)
        assert pod.node_name is None and pod.assignment is None, "the 409 left it unbound"

        uids["uid"] = now  # the watches caught up: the gang's next attempt binds it
        await asyncio.to_thread(port.bind, PLACED)
        pod = await cluster.get_pod(REF)
        assert pod.node_name == "gpu-a" and pod.assignment is not None
        assert pod.assignment.pod_uid == now and our_bind(pod)
    finally:
        await cluster.close()
