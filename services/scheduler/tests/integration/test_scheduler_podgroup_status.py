"""A PodGroup's status follows its pods (as the scheduler-plugins controller keeps it): Pending with
too few members, then Running with every member bound and running, then Finished when they have
succeeded; read back through the official client from the devcluster's API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tessera.cluster.builders import PodManifest, pod_group_manifest
from tessera.core.db.migrations import migrate_all
from tessera.devcluster.apiserver import PODGROUPS, PODS
from tessera.devcluster.runner import DevCluster
from tessera.scheduler import bootstrap
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.entrypoints.podgroup_status import GROUP, PLURAL, VERSION
from tessera.testing.services import eventually, reset_jetstream, running, settings_for

pytestmark = pytest.mark.integration

CLUSTER_FILE = Path(__file__).resolve().parents[4] / "examples" / "clusters" / "dev-4x8.yaml"


@pytest.fixture
def devcluster() -> Iterator[DevCluster]:
    with DevCluster.from_file(CLUSTER_FILE, speed=20.0) as cluster:
        yield cluster


@pytest.fixture
async def settings(
    nats_url: str, fresh_database: str, devcluster: DevCluster, tmp_path: Path
) -> AsyncIterator[SchedulerSettings]:
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate_all, fresh_database)
    kubeconfig = devcluster.write_kubeconfig(tmp_path / "kubeconfig")
    yield settings_for(SchedulerSettings, nats_url, fresh_database, kubeconfig=kubeconfig, poll_s=0.2)


def member(name: str, seconds: int) -> dict[str, Any]:
    return (
        PodManifest(name)
        .scheduler()
        .group("train")
        .requests(cpu="2", memory="8Gi")
        .gpus(2)
        .annotate("tessera.io/sim-duration", str(seconds))
        .obj()
    )


def status(kubeconfig: Path) -> dict[str, Any]:
    with kubernetes.config.new_client_from_config(str(kubeconfig)) as api:  # type: ignore[no-untyped-call]
        custom: Any = kubernetes.client.CustomObjectsApi(api)
        group: dict[str, Any] = custom.get_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, "train"
        )
    found: dict[str, Any] = group.get("status") or {}
    return found


async def test_the_status_follows_the_pods_from_pending_to_finished(
    settings: SchedulerSettings, devcluster: DevCluster
) -> None:
    assert settings.kubeconfig is not None
    kubeconfig = settings.kubeconfig
    store = devcluster.store
    store.create(PODGROUPS, "default", pod_group_manifest("train", min_member=2))
    store.create(PODS, "default", member("train-0", 40))

    async def phase(expected: str) -> dict[str, Any] | None:
        now = await asyncio.to_thread(status, kubeconfig)
        return now if now.get("phase") == expected else None

    async with running(bootstrap.build(settings), settings):
        pending = await eventually(lambda: phase("Pending"), what="one of two members: Pending", timeout=30)
        assert pending["scheduled"] == pending["running"] == 0

        store.create(PODS, "default", member("train-1", 40))
        run = await eventually(lambda: phase("Running"), what="both members bound and running", timeout=60)
        assert (run["scheduled"], run["running"], run["failed"]) == (2, 2, 0)
        assert run["scheduleStartTime"]

        done = await eventually(lambda: phase("Finished"), what="both members succeeded", timeout=60)
        assert (done["succeeded"], done["running"], done["failed"]) == (2, 0, 0)
