"""The LeaderWorkerSet controller, through the official client over HTTP: a leader StatefulSet, a worker
StatefulSet per leader pod, the pods' labels, status and conditions, scaling, a group made again when
its leader goes, and deletion cascading through the garbage collector."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tessera.devcluster.runner import DevCluster
from tessera.devcluster.testing import api_client, binding_scheduler, start_cluster, wait_for

pytestmark = pytest.mark.integration

NS = "default"
GROUP, VERSION, PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
P = "leaderworkerset.sigs.k8s.io/"


@pytest.fixture
def cluster() -> Iterator[DevCluster]:
    running = start_cluster()
    yield running
    running.stop()


@pytest.fixture
def api(cluster: DevCluster) -> Iterator[client.ApiClient]:
    with api_client(cluster) as api:
        yield api


def template(image: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "vllm"}},
        "spec": {"containers": [{"name": "vllm", "image": image}]},
    }


def lws(name: str, replicas: int, size: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {
                "size": size,
                "leaderTemplate": template("vllm/vllm-openai:v0.6.3"),
                "workerTemplate": template("vllm/vllm-openai:v0.6.3-worker"),
            },
        },
    }


def read(api: client.ApiClient, name: str) -> dict[str, Any]:
    found: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, name
    )
    return found


def pods(api: client.ApiClient, name: str) -> dict[str, client.V1Pod]:
    listed = client.CoreV1Api(api).list_namespaced_pod(NS, label_selector=f"{P}name={name}").items
    return {p.metadata.name: p for p in listed if p.metadata.deletion_timestamp is None}


def condition(obj: dict[str, Any], kind: str) -> tuple[str, str] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return c["status"], c["reason"]
    return None


def test_groups_of_a_leader_and_its_workers_with_upstream_names_labels_and_status(
    api: client.ApiClient,
) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, lws("llm", 2, 3))

    made = wait_for(lambda: len(p := pods(api, "llm")) == 6 and p, what="six pods")
    assert sorted(made) == ["llm-0", "llm-0-1", "llm-0-2", "llm-1", "llm-1-1", "llm-1-2"]
    leader, worker = made["llm-1"], made["llm-1-2"]
    assert leader.spec.containers[0].image == "vllm/vllm-openai:v0.6.3"
    assert worker.spec.containers[0].image == "vllm/vllm-openai:v0.6.3-worker"
    key = hashlib.sha1(f"{NS}/llm-1".encode()).hexdigest()
    assert {
        k: leader.metadata.labels[k] for k in (f"{P}group-index", f"{P}worker-index", f"{P}group-key")
    } == {
        f"{P}group-index": "1",
        f"{P}worker-index": "0",
        f"{P}group-key": key,
    }
    assert (worker.metadata.labels[f"{P}group-index"], worker.metadata.labels[f"{P}worker-index"]) == (
        "1",
        "2",
    )
    assert worker.metadata.labels[f"{P}group-key"] == key and worker.metadata.labels["app"] == "vllm"
    assert worker.metadata.annotations[f"{P}size"] == "3"
    assert worker.metadata.annotations[f"{P}leader-name"] == "llm-1"
    env = {e.name: e.value for e in worker.spec.containers[0].env}
    assert env == {"LWS_LEADER_ADDRESS": f"llm-1.llm.{NS}", "LWS_GROUP_SIZE": "3", "LWS_WORKER_INDEX": "2"}
    assert worker.spec.hostname == "llm-1-2" and worker.spec.subdomain == "llm"

    apps = client.AppsV1Api(api)
    leaders = apps.read_namespaced_stateful_set("llm", NS)
    assert leaders.spec.replicas == 2 and leaders.spec.pod_management_policy == "Parallel"
    assert (leaders.metadata.owner_references[0].kind, leaders.metadata.owner_references[0].name) == (
        "LeaderWorkerSet",
        "llm",
    )
    workers = apps.read_namespaced_stateful_set("llm-1", NS)
    assert workers.spec.replicas == 2
    owner = workers.metadata.owner_references[0]
    assert (owner.kind, owner.name, owner.uid) == ("Pod", "llm-1", leader.metadata.uid)
    service = client.CoreV1Api(api).read_namespaced_service("llm", NS)
    assert service.spec.cluster_ip == "None" and service.spec.selector == {f"{P}name": "llm"}

    assert condition(read(api, "llm"), "Available") == ("False", "GroupsNotReady")
    with binding_scheduler(api):
        ready = wait_for(
            lambda: condition(o := read(api, "llm"), "Available") == ("True", "AllGroupsReady") and o,
            what="the LeaderWorkerSet available",
        )
    assert (ready["status"]["replicas"], ready["status"]["readyReplicas"]) == (2, 2)
    assert condition(ready, "Progressing") == ("False", "GroupsReady")
    assert ready["status"]["hpaPodSelector"] == f"{P}name=llm,{P}worker-index=0"


def test_scaling_adds_groups_a_deleted_leader_remakes_its_group_and_deletion_cascades(
    api: client.ApiClient,
) -> None:
    objects, apps, core = client.CustomObjectsApi(api), client.AppsV1Api(api), client.CoreV1Api(api)
    objects.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, lws("serve", 1, 2))
    wait_for(lambda: sorted(pods(api, "serve")) == ["serve-0", "serve-0-1"], what="one group")

    objects.patch_namespaced_custom_object_scale(
        GROUP, VERSION, NS, PLURAL, "serve", {"spec": {"replicas": 2}}
    )
    wait_for(lambda: sorted(pods(api, "serve"))[2:] == ["serve-1", "serve-1-1"], what="the second group")
    assert read(api, "serve")["spec"]["replicas"] == 2

    old = pods(api, "serve")["serve-1"].metadata.uid
    core.delete_namespaced_pod("serve-1", NS)

    def remade() -> bool:
        found = pods(api, "serve")
        if "serve-1" not in found or found["serve-1"].metadata.uid == old or "serve-1-1" not in found:
            return False
        owner = apps.read_namespaced_stateful_set("serve-1", NS).metadata.owner_references[0]
        return bool(owner.uid == found["serve-1"].metadata.uid)

    wait_for(remade, what="the group made again under its new leader")

    objects.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "serve")
    wait_for(lambda: pods(api, "serve") == {}, what="every pod deleted")
    left = apps.list_namespaced_stateful_set(NS, label_selector=f"{P}name=serve").items
    assert left == []
    wait_for(
        lambda: "serve" not in {s.metadata.name for s in core.list_namespaced_service(NS).items},
        what="the service deleted",
    )
