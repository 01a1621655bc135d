"""Two slicing replicas on one devcluster elect a leader on the `tessera-slicing` Lease
(coordination.k8s.io/v1): only the leader plans layouts. When it stops, or vanishes without releasing
the Lease, the follower takes over (at once, or once the Lease runs out) and plans the demand that
comes next."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.cluster.builders import PodManifest
from tessera.cluster.cluster_file import NodeSpec
from tessera.cluster.conventions import MIG_CONFIG_STATE_LABEL
from tessera.cluster.leader import LeaderElector
from tessera.contracts import subjects
from tessera.contracts.events import DemandChanged, GpuDemand
from tessera.devcluster.apiserver.resources import LEASES
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.slicing import bootstrap
from tessera.slicing.service_layer.dependencies import SlicingDeps
from tessera.testing.services import eventually, running

from .conftest import Kube, Stack

pytestmark = pytest.mark.integration

QUICK_LEASE = {"lease_duration_s": 3.0, "renew_deadline_s": 2.0, "retry_period_s": 0.5}
MIG_DEMAND = DemandChanged(
    pending_gangs=1, demand=[GpuDemand(gpus=1, milli=1000, mig_profile="3g.40gb", pods=1)]
)


@pytest.fixture
def cluster() -> Iterator[DevCluster]:
    node = NodeSpec("a100-0", 64_000, 512_000, "A100-80GB", 2, 81920, {})
    with DevCluster(
        [node], settings=SimSettings(speed=1.0, pod_start_seconds=0.2, mig_reconfigure_seconds=1.0)
    ) as devcluster:
        yield devcluster


def elector(service: Any) -> LeaderElector:
    deps: SlicingDeps = service.deps
    assert deps.leader is not None, "leader election is on by default with a kubeconfig"
    return deps.leader


def holder(cluster: DevCluster) -> str | None:
    lease = cluster.store.get(LEASES, "default", "tessera-slicing")
    return (lease.get("spec") or {}).get("holderIdentity") or None


@pytest.mark.parametrize("leaves", ["stops", "vanishes"])
async def test_only_the_lease_holder_plans_and_the_follower_takes_over_when_it_leaves(
    stack: Stack, cluster: DevCluster, tmp_path: Path, leaves: str
) -> None:
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    api = Kube(kubeconfig)
    settings = stack.settings(kubeconfig, leader_election=QUICK_LEASE)
    try:
        async with contextlib.AsyncExitStack() as leading:
            leader = await leading.enter_async_context(running(bootstrap.build(settings), settings))
            await eventually(lambda: _leads(leader, cluster), what="the only replica leading", timeout=15)
            async with running(bootstrap.build(settings), settings) as follower:

                async def follower_waits() -> bool:
                    seen = elector(follower).leader == elector(leader).identity
                    return seen and not elector(follower).leading

                await eventually(follower_waits, what="the second replica following", timeout=10)
                if leaves == "vanishes":  # gone without a word: the Lease stays held until it runs out
                    elector(leader).release = _no_release  # type: ignore[method-assign]
                await leading.aclose()  # the leader stops (and releases the lease, unless it vanishes)
                await eventually(
                    lambda: _leads(follower, cluster), what="the follower taking over", timeout=20
                )

                await api.create_pod(PodManifest("wants-3g").scheduler().mig("3g.40gb").obj())
                await stack.publish(MIG_DEMAND)

                async def reconfigured() -> bool:
                    return (await api.labels("a100-0")).get(MIG_CONFIG_STATE_LABEL) == "success"

                await eventually(
                    reconfigured, what="the new leader planning and applying a layout", timeout=60
                )
        [planned] = await stack.events(subjects.LAYOUT_PLANNED)
        assert planned.node == "a100-0"
        assert holder(cluster) is None  # released on a clean stop
    finally:
        api.close()


async def _no_release() -> None:
    return None


async def _leads(service: Any, cluster: DevCluster) -> bool:
    return elector(service).leading and holder(cluster) == elector(service).identity
