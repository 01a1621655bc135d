"""A spot interruption, seen through the official Kubernetes client: the notice's taint, then the node's end."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tessera.cluster.cluster_file import NodeSpec
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.devcluster.sim.nvml import DutyCycleTrace
from tessera.devcluster.sim.spot import (
    SPOT_INTERRUPTION_CONDITION,
    SPOT_INTERRUPTION_TAINT,
    TERMINATION_DEADLINE_ANNOTATION,
)

pytestmark = pytest.mark.integration

# real time: a notice of 1 simulated second lasts 1 second
SETTINGS = SimSettings(speed=1.0, pod_start_seconds=0.1)


@pytest.fixture
def cluster() -> Iterator[DevCluster]:
    nodes = [NodeSpec(f"gpu-{i}", 96_000, 1_048_576, "A100-80GB", 8, 81920, {}) for i in range(2)]
    with DevCluster(nodes, settings=SETTINGS, duty_cycle=DutyCycleTrace.synthetic()) as running:
        yield running


@pytest.fixture
def core(cluster: DevCluster) -> Iterator[client.CoreV1Api]:
    configuration = client.Configuration()
    configuration.host = cluster.url
    with client.ApiClient(configuration) as api:
        yield client.CoreV1Api(api)


def wait_for(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Poll until `check` returns something truthy; fail with the last value when it never does."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition never held; last value: {value!r}")
        time.sleep(0.02)


def faults(cluster: DevCluster, node: str, body: dict[str, Any] | None) -> tuple[int, Any]:
    """POST (or with no body, DELETE) /faults/<node>, as `tessera devcluster fault` does."""
    request = urllib.request.Request(
        f"{cluster.url}/faults/{node}",
        data=json.dumps(body).encode() if body is not None else None,
        method="POST" if body is not None else "DELETE",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def run_pod(core: client.CoreV1Api, name: str, node: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "tessera",
            "containers": [
                {"name": "main", "image": "trainer:1", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
            ],
        },
    }
    core.create_namespaced_pod("default", pod)
    binding = client.V1Binding(
        metadata=client.V1ObjectMeta(name=name), target=client.V1ObjectReference(kind="Node", name=node)
    )
    core.create_namespaced_pod_binding(name, "default", binding, _preload_content=False)
    wait_for(lambda: core.read_namespaced_pod(name, "default").status.phase == "Running")


def node_exists(core: client.CoreV1Api, name: str) -> bool:
    try:
        core.read_node(name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def test_a_spot_interruption_taints_the_node_then_deletes_it_when_the_notice_runs_out(
    cluster: DevCluster, core: client.CoreV1Api
) -> None:
    run_pod(core, "victim", "gpu-1")
    since = core.list_node().metadata.resource_version

    sent = time.monotonic()
    status, answer = faults(cluster, "gpu-1", {"kind": "spot-interruption", "notice_s": 1})
    noticed = core.read_node("gpu-1")

    assert status == 200, answer
    injected = answer["injected"]
    assert injected["kind"] == "spot-interruption" and injected["notice_s"] == 1
    [taint] = [t for t in noticed.spec.taints if t.key == SPOT_INTERRUPTION_TAINT]
    assert (taint.value, taint.effect) == (injected["event_id"], "NoSchedule")
    assert taint.value.startswith("spot-itn-") and len(taint.value) <= 63
    assert noticed.spec.unschedulable is True
    assert noticed.metadata.annotations[TERMINATION_DEADLINE_ANNOTATION] == injected["terminates_at"]
    [condition] = [c for c in noticed.status.conditions if c.type == SPOT_INTERRUPTION_CONDITION]
    assert condition.status == "True" and injected["terminates_at"] in condition.message
    assert core.read_namespaced_pod("victim", "default").status.phase == "Running"  # not drained

    events = watch.Watch().stream(
        core.list_node,
        resource_version=since,
        field_selector="metadata.name=gpu-1",
        timeout_seconds=20,
    )
    deleted = next((e for e in events if e["type"] == "DELETED"), None)
    waited = time.monotonic() - sent

    assert deleted is not None, "the node was not deleted within 20 seconds"
    assert waited >= 0.9, f"deleted {waited:.2f}s after a notice of 1s"
    assert not node_exists(core, "gpu-1")
    victim = wait_for(
        lambda: (p := core.read_namespaced_pod("victim", "default")).status.phase == "Failed" and p
    )
    assert victim.status.reason == "NodeLost"
    assert node_exists(core, "gpu-0") and not core.read_node("gpu-0").spec.taints


def test_a_second_notice_conflicts_and_clearing_withdraws_a_pending_one(
    cluster: DevCluster, core: client.CoreV1Api
) -> None:
    first, _ = faults(cluster, "gpu-0", {"kind": "spot-interruption", "notice_s": 600})
    second, conflict = faults(cluster, "gpu-0", {"kind": "spot-interruption", "notice_s": 1})
    assert (first, second) == (200, 409)
    assert "already has a spot interruption notice" in conflict["message"]

    cleared, _ = faults(cluster, "gpu-0", None)

    node = core.read_node("gpu-0")
    assert cleared == 200
    assert not node.spec.taints and not node.spec.unschedulable
    assert TERMINATION_DEADLINE_ANNOTATION not in (node.metadata.annotations or {})
    assert all(c.type != SPOT_INTERRUPTION_CONDITION for c in node.status.conditions)


def test_a_deleted_node_takes_no_notice_and_is_not_cleared_back(
    cluster: DevCluster, core: client.CoreV1Api
) -> None:
    faults(cluster, "gpu-1", {"kind": "spot-interruption", "notice_s": 0})
    wait_for(lambda: not node_exists(core, "gpu-1"))

    again, gone = faults(cluster, "gpu-1", {"kind": "spot-interruption", "notice_s": 1})
    cleared, refused = faults(cluster, "gpu-1", None)

    assert again == 409 and "gone" in gone["message"]
    assert cleared == 409 and "deleted" in refused["message"]
    assert not node_exists(core, "gpu-1")


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"kind": "spot-interruption", "notice_s": -1}, "notice_s"),
        ({"kind": "spot-interruption", "notice_s": "30s"}, "notice_s"),
        ({"kind": "spot-interruption", "gpu": 2}, "whole node"),
    ],
)
def test_a_bad_spot_interruption_is_refused_naming_the_field(
    cluster: DevCluster, body: dict[str, Any], problem: str
) -> None:
    status, answer = faults(cluster, "gpu-0", body)

    assert status == 400 and problem in answer["message"]
