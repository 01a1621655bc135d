"""Test helpers for code that runs workloads on the devcluster: a fast devcluster on a thread, an
official-client ApiClient for it, a stand-in scheduler that binds every pending pod through
pods/binding (as Tessera's scheduler would), and polling that fails with the last value seen."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kubernetes import client

from tessera.cluster.cluster_file import NodeSpec
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.devcluster.sim.nvml import DutyCycleTrace

FAST = SimSettings(speed=50.0, pod_start_seconds=1.0)
NODE = "gpu-0"


def start_cluster() -> DevCluster:
    nodes = [NodeSpec(NODE, 96_000, 1_048_576, "A100-80GB", 8, 81920, {})]
    cluster = DevCluster(nodes, settings=FAST, duty_cycle=DutyCycleTrace.synthetic(), podresources=False)
    cluster.start()
    return cluster


@contextmanager
def api_client(cluster: DevCluster) -> Iterator[client.ApiClient]:
    configuration = client.Configuration()
    configuration.host = cluster.url
    with client.ApiClient(configuration) as api:
        yield api


@contextmanager
def binding_scheduler(api: client.ApiClient, node: str = NODE) -> Iterator[list[str]]:
    """Binds every unbound pod to `node` through pods/binding, until the block ends; yields the names
    it bound, in order."""
    core = client.CoreV1Api(api)
    bound: list[str] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            answer: Any = core.list_pod_for_all_namespaces(
                field_selector="spec.nodeName=", _preload_content=False
            )
            for pod in json.loads(answer.data)["items"]:
                meta = pod["metadata"]
                if meta.get("deletionTimestamp") or pod["status"].get("phase") != "Pending":
                    continue
                body = client.V1Binding(
                    metadata=client.V1ObjectMeta(name=meta["name"]),
                    target=client.V1ObjectReference(kind="Node", name=node),
                )
                # unparsed: the client's Binding model cannot read the Status the server answers
                reply: Any = core.create_namespaced_pod_binding(
                    meta["name"], meta["namespace"], body, _preload_content=False
                )
                reply.read()
                reply.release_conn()
                bound.append(str(meta["name"]))
            stop.wait(0.02)

    thread = threading.Thread(target=loop, name="binding-scheduler", daemon=True)
    thread.start()
    try:
        yield bound
    finally:
        stop.set()
        thread.join(5)


def wait_for(check: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll until `check` returns something truthy; fail with the last value when it never does."""
    deadline = time.monotonic() + timeout
    value = check()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} never held within {timeout} s; last value: {value!r}")
        time.sleep(0.02)
        value = check()
    return value


def conditions(obj: Any) -> dict[str, tuple[str, str | None]]:
    """type -> (status, reason) of an official-client object's status conditions."""
    return {c.type: (c.status, c.reason) for c in (obj.status.conditions or [])}
