"""The simulated HPA controller closes the loop on a devcluster: a load generator replays a ramp into a
Deployment's pods and serves the load as an External metric; the HPA controller reads it over HTTP,
scales the Deployment through `/scale` with upstream's formula, and the pods, which take two seconds to
become ready, leave the steps right after the ramp under-provisioned until they are."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tessera.cluster.cluster_file import NodeSpec
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.devcluster.sim.hpa import HpaController
from tessera.devcluster.sim.load import LoadGenerator
from tessera.devcluster.sim.nvml import DutyCycleTrace
from tessera.devcluster.testing import NODE, api_client, binding_scheduler, wait_for

pytestmark = pytest.mark.integration

NS = "default"
POD_START_S = 2.0
STEP_S = 0.5
RATES = [5.0] * 6 + [45.0] * 16  # one pod's worth, then a ramp to four and a half


@pytest.fixture
def cluster() -> Iterator[DevCluster]:
    nodes = [NodeSpec(NODE, 96_000, 1_048_576, "A100-80GB", 8, 81920, {})]
    settings = SimSettings(speed=1.0, pod_start_seconds=POD_START_S)
    running = DevCluster(nodes, settings=settings, duty_cycle=DutyCycleTrace.synthetic(), podresources=False)
    running.start()
    yield running
    running.stop()


def workload(api: client.ApiClient) -> None:
    client.AppsV1Api(api).create_namespaced_deployment(
        NS,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "chat"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "chat"}},
                "template": {
                    "metadata": {"labels": {"app": "chat"}},
                    "spec": {"containers": [{"name": "server", "image": "vllm/vllm-openai:v0.6.3"}]},
                },
            },
        },
    )
    hpa: Any = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "chat"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat"},
            "minReplicas": 1,
            "maxReplicas": 10,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {"name": "load"},
                        "target": {"type": "AverageValue", "averageValue": "10"},
                    },
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
        },
    }
    client.AutoscalingV2Api(api).create_namespaced_horizontal_pod_autoscaler(NS, hpa, _preload_content=False)


async def test_a_reactive_hpa_follows_a_ramp_and_the_pods_start_late(cluster: DevCluster) -> None:
    with api_client(cluster) as api, binding_scheduler(api):
        workload(api)
        load = LoadGenerator(cluster.url, NS, "chat", RATES, capacity=10.0, step_s=STEP_S)
        metrics_url = await load.serve()
        hpa = HpaController(cluster.url, metrics_url, sync_s=STEP_S)
        stop = asyncio.Event()
        try:
            # the first pod is up before the replay starts
            await asyncio.to_thread(wait_for, lambda: load.ready_pods() >= 1, 20.0, "the first pod")
            controller = asyncio.create_task(hpa.run(stop))
            steps = await load.run()
        finally:
            stop.set()
            await load.close()
        await controller
        hpa.close()
        answer: Any = client.AutoscalingV2Api(api).read_namespaced_horizontal_pod_autoscaler(
            "chat", NS, _preload_content=False
        )
        status = json.loads(answer.data)["status"]
    ramp = RATES.index(45.0)
    assert not any(s.under for s in steps[:ramp])  # one pod carries 5
    assert [(key, before, after) for _, key, before, after in hpa.scales] == [("default/chat", 1, 5)]
    assert status["desiredReplicas"] == 5
    # the HPA sees the ramp at once, but the new pods take POD_START_S to be ready: the steps right
    # after the ramp are short, the last ones are not
    assert steps[ramp].under and steps[ramp].utilisation(10.0) == pytest.approx(4.5)
    assert load.under_provisioned(since=ramp) >= POD_START_S / STEP_S - 1
    assert all(not s.under and s.ready == 5 for s in steps[-3:])
