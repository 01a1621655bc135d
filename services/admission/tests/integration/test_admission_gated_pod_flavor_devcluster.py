"""A gated pod admitted in a flavor that names node labels and tolerations is put on that flavor's
nodes as its gate goes: the flavor's labels join the pod's own `nodeSelector` and its tolerations
join the pod's, in the patch that removes the gate (Kubernetes lets a gated pod gain both), as
admission does for the Jobs it unsuspends; the pod binds on a node carrying those labels."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tessera.testing.services import eventually

from .test_admission_gated_pods_devcluster import NS, Cluster, deployment, stack

pytestmark = pytest.mark.integration

ZONE = "topology.kubernetes.io/zone"
TOLERATION = {"key": "example.com/dedicated", "operator": "Exists", "effect": "NoSchedule"}
QUEUES = {
    "flavors": [
        {
            "name": "a100-80gb",
            "gpu_model": "A100-80GB",
            "node_labels": {ZONE: "rack-a"},
            "tolerations": [TOLERATION],
        }
    ],
    "queues": [{"name": "serving", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu-milli": 1000}}]}],
    "tenant_queues": [{"tenant": NS, "queue": "serving"}],
}


async def test_a_released_pod_gains_its_flavor_s_node_selector_and_tolerations(
    nats_url: str, fresh_database: str, tmp_path: Path
) -> None:
    async with (
        stack(nats_url, fresh_database, tmp_path) as (api, url, _),
        httpx.AsyncClient(base_url=url) as http,
    ):
        assert (await http.put("/v1/config", json=QUEUES)).status_code == 200
        cluster = Cluster(api, http)
        pod: dict[str, Any] = deployment("placed", 1)["spec"]["template"]
        pod["metadata"]["name"] = "placed"
        pod["spec"]["nodeSelector"] = {"kubernetes.io/os": "linux"}  # the user's own, kept
        await asyncio.to_thread(cluster.core.create_namespaced_pod, NS, pod)
        (bound,), _ = await eventually(
            lambda: cluster.split("placed", 1, 0), what="the pod bound", timeout=60
        )

        assert bound["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux", ZONE: "rack-a"}
        assert TOLERATION in bound["spec"]["tolerations"]
        node = await asyncio.to_thread(cluster.core.read_node, bound["spec"]["nodeName"])
        assert node.metadata.labels[ZONE] == "rack-a"
        events = await cluster.events("placed")
        assert any(r == "Admitted" and "in flavor a100-80gb" in m for r, m in events), events
