"""Telemetry on nodes whose kubelet PodResources socket is missing: usage falls back to the GPU
source's own holders (here the devcluster's pods, as dcgm-exporter's pod labels or NVML's pids
would be) with a warning, and `/readyz` shows a `podresources` condition naming the nodes, while the
service stays ready."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tessera.cluster.cluster_file import load_cluster
from tessera.core.db.migrations import migrate_all
from tessera.core.runner import create_app
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.devcluster.sim.nvml import DutyCycleTrace
from tessera.telemetry import bootstrap
from tessera.telemetry.adapters.sources.devcluster import DevclusterSource
from tessera.telemetry.config import TelemetrySettings
from tessera.testing.services import eventually, reset_jetstream, settings_for

pytestmark = pytest.mark.integration

CLUSTER = """
nodes:
  - name_prefix: gpu-node-
    count: 1
    cpu: "64"
    memory: 512Gi
    gpus: {count: 2, model: A100-80GB}
"""


class NoKubeletSocket(DevclusterSource):
    """The devcluster's GPUs, on nodes whose kubelet PodResources socket does not exist."""

    def __init__(self, url: str, socket_path: Path) -> None:
        super().__init__(url)
        self.socket_path = str(socket_path)

    async def podresources_endpoints(self) -> dict[str, str]:
        return {node: self.socket_path for node in await super().podresources_endpoints()}


@pytest.fixture
def devcluster(tmp_path: Path) -> Iterator[DevCluster]:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    cluster = DevCluster(
        load_cluster(tmp_path / "cluster.yaml"),
        settings=SimSettings(speed=10, pod_start_seconds=0.1),
        duty_cycle=DutyCycleTrace.synthetic(),
    )
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
async def system(nats_url: str, fresh_database: str) -> AsyncIterator[tuple[str, str]]:
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate_all, fresh_database)
    yield nats_url, fresh_database


def trainer(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"tessera.io/sim-profile": "training"}},
        "spec": {
            "nodeName": "gpu-node-0",
            "containers": [
                {
                    "name": "main",
                    "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


async def test_a_missing_podresources_socket_falls_back_with_a_warning_and_a_readyz_condition(
    system: tuple[str, str], devcluster: DevCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nats_url, db = system
    settings = settings_for(
        TelemetrySettings, nats_url, db, devcluster_url=devcluster.url, sample_interval_s=0.5
    )
    async with httpx.AsyncClient() as http:
        created = await http.post(f"{devcluster.url}/api/v1/namespaces/default/pods", json=trainer("train-0"))
        assert created.status_code == 201, created.text
    source = NoKubeletSocket(devcluster.url, tmp_path / "kubelet.sock")
    app = create_app(bootstrap.build(settings, source), settings)
    caplog.set_level(logging.WARNING, logger="tessera.telemetry")
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://telemetry") as api,
    ):

        async def degraded() -> dict[str, Any] | None:
            body: dict[str, Any] = (await api.get("/readyz")).json()
            return body if "podresources" in body.get("conditions", {}) else None

        body = await eventually(degraded, what="the podresources condition on /readyz", timeout=30)
        condition = body["conditions"]["podresources"]
        assert body["ready"] is True and condition["status"] == "degraded"
        assert list(condition["nodes"]) == ["gpu-node-0"]
        assert "does not exist" in condition["nodes"]["gpu-node-0"], condition
        assert any("PodResources unavailable" in r.getMessage() for r in caplog.records)

        ledger = app.state.deps.ledger
        assert ledger is not None

        async def billed_to_the_pod() -> bool:
            return any(key.pod.endswith("train-0") for key in ledger.accountant.rows)

        await eventually(billed_to_the_pod, what="the trainer's usage from the source's holders", timeout=30)
