"""Two forecaster replicas with a kubeconfig elect a leader on the `tessera-forecaster` Lease
(coordination.k8s.io/v1): only the leader runs the forecasting rounds and the PredictiveAutoscaler
controller; when it stops, the follower takes over both."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.cluster.leader import LeaderElector
from tessera.core.db.migrations import migrate
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.apiserver.resources import LEASES
from tessera.forecaster import bootstrap
from tessera.forecaster.config import ForecasterSettings
from tessera.forecaster.service_layer.dependencies import ForecasterDeps
from tessera.testing.services import eventually, running, settings_for

pytestmark = pytest.mark.integration

QUICK_LEASE = {"lease_duration_s": 3.0, "renew_deadline_s": 2.0, "retry_period_s": 0.5}


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    server = ApiServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def elector(service: Any) -> LeaderElector:
    deps: ForecasterDeps = service.deps
    assert deps.leader is not None, "leader election is on by default with a kubeconfig"
    return deps.leader


def holder(apiserver: ApiServer) -> str | None:
    lease = apiserver.store.get(LEASES, "default", "tessera-forecaster")
    return (lease.get("spec") or {}).get("holderIdentity") or None


async def test_only_the_lease_holder_forecasts_and_reconciles_and_the_follower_takes_over(
    nats_url: str, fresh_database: str, apiserver: ApiServer, tmp_path: Path
) -> None:
    await asyncio.to_thread(migrate, "forecaster", fresh_database)
    settings = settings_for(
        ForecasterSettings,
        nats_url,
        fresh_database,
        grpc_host="127.0.0.1",
        grpc_port=0,
        step_s=0.2,
        kubeconfig=apiserver.write_kubeconfig(tmp_path / "kubeconfig"),
        controller_interval_s=0.2,
        leader_election=QUICK_LEASE,
    )

    async def leads(service: Any) -> bool:
        return elector(service).leading and holder(apiserver) == elector(service).identity

    async with contextlib.AsyncExitStack() as leading:
        leader = await leading.enter_async_context(running(bootstrap.build(settings), settings))
        await eventually(lambda: leads(leader), what="the only replica leading", timeout=15)
        async with running(bootstrap.build(settings), settings) as follower:

            async def follows() -> bool:
                seen = elector(follower).leader == elector(leader).identity
                return seen and not elector(follower).leading

            await eventually(follows, what="the second replica following", timeout=10)
            rounds, passes = leader.deps.rounds, leader.deps.autoscaler_passes

            async def leader_works() -> bool:
                return leader.deps.rounds > rounds + 2 and leader.deps.autoscaler_passes > passes + 2

            await eventually(leader_works, what="the leader's rounds and controller passes", timeout=15)
            assert (follower.deps.rounds, follower.deps.autoscaler_passes) == (0, 0)

            await leading.aclose()  # the leader stops (and releases the lease)
            await eventually(lambda: leads(follower), what="the follower taking over", timeout=10)

            async def follower_works() -> bool:
                return follower.deps.rounds > 0 and follower.deps.autoscaler_passes > 0

            await eventually(follower_works, what="the new leader's rounds and passes", timeout=15)
    assert holder(apiserver) is None  # released on a clean stop
