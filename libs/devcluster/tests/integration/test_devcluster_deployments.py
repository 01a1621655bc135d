"""The ReplicaSet and Deployment controllers, through the official client over HTTP: replicas kept,
a new template rolled out through a new ReplicaSet, the scale subresource, and cascading deletion."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tessera.devcluster.runner import DevCluster
from tessera.devcluster.testing import api_client, binding_scheduler, start_cluster, wait_for

pytestmark = pytest.mark.integration

NS = "default"
IMAGE_V1 = "vllm/vllm-openai:v0.6.3"
IMAGE_V2 = "vllm/vllm-openai:v0.6.4"


@pytest.fixture
def cluster() -> Iterator[DevCluster]:
    running = start_cluster()
    yield running
    running.stop()


@pytest.fixture
def api(cluster: DevCluster) -> Iterator[client.ApiClient]:
    with api_client(cluster) as api:
        yield api


def deployment(name: str, replicas: int, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "server", "image": image}]},
            },
        },
    }


def pods(api: client.ApiClient, app: str) -> list[client.V1Pod]:
    found = client.CoreV1Api(api).list_namespaced_pod(NS, label_selector=f"app={app}").items
    return [p for p in found if not p.metadata.deletion_timestamp]


def replicasets(api: client.ApiClient, app: str) -> dict[str, client.V1ReplicaSet]:
    found = client.AppsV1Api(api).list_namespaced_replica_set(NS, label_selector=f"app={app}").items
    return {rs.metadata.name: rs for rs in found}


def test_a_deployment_runs_its_replicas_through_a_replicaset(api: client.ApiClient) -> None:
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment(NS, deployment("chat", 2, IMAGE_V1))

    with binding_scheduler(api):
        ready = wait_for(
            lambda: (d := apps.read_namespaced_deployment("chat", NS)).status.available_replicas == 2 and d,
            what="two available replicas",
        )

    (rs,) = replicasets(api, "chat").values()
    template_hash = rs.metadata.labels["pod-template-hash"]
    assert rs.metadata.name == f"chat-{template_hash}"
    assert rs.spec.selector.match_labels == {"app": "chat", "pod-template-hash": template_hash}
    assert rs.metadata.owner_references[0].kind == "Deployment"
    assert ready.metadata.annotations["deployment.kubernetes.io/revision"] == "1"
    assert {c.type: c.status for c in ready.status.conditions} == {"Available": "True", "Progressing": "True"}
    running = pods(api, "chat")
    assert len(running) == 2
    assert all(p.metadata.name.startswith(f"chat-{template_hash}-") for p in running)
    assert {p.status.phase for p in running} == {"Running"}


def test_a_new_template_rolls_out_through_a_new_replicaset(api: client.ApiClient) -> None:
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment(NS, deployment("roll", 3, IMAGE_V1))
    with binding_scheduler(api):
        wait_for(lambda: apps.read_namespaced_deployment("roll", NS).status.available_replicas == 3)
        (old_name,) = replicasets(api, "roll")

        patch = {"spec": {"template": {"spec": {"containers": [{"name": "server", "image": IMAGE_V2}]}}}}
        apps.patch_namespaced_deployment("roll", NS, patch)

        def rolled_out() -> bool:
            sets = replicasets(api, "roll")
            live = pods(api, "roll")
            return (
                len(sets) == 2
                and sets[old_name].spec.replicas == 0
                and len(live) == 3
                and all(p.spec.containers[0].image == IMAGE_V2 and p.status.phase == "Running" for p in live)
            )

        wait_for(rolled_out, what="the rollout")
        done = wait_for(
            lambda: (
                (d := apps.read_namespaced_deployment("roll", NS)).status.updated_replicas == 3
                and d.status.available_replicas == 3
                and d
            ),
            what="the status after the rollout",
        )

    (new_name,) = set(replicasets(api, "roll")) - {old_name}
    assert replicasets(api, "roll")[new_name].metadata.annotations["deployment.kubernetes.io/revision"] == "2"
    assert done.metadata.annotations["deployment.kubernetes.io/revision"] == "2"
    progressing = next(c for c in done.status.conditions if c.type == "Progressing")
    assert progressing.reason == "NewReplicaSetAvailable"
    events = client.CoreV1Api(api).list_namespaced_event(NS, field_selector="involvedObject.name=roll").items
    assert any(e.message == f"Scaled up replica set {new_name} from 0 to 1" for e in events)


def test_the_scale_subresource_scales_the_deployment(api: client.ApiClient) -> None:
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment(NS, deployment("web", 1, IMAGE_V1))
    wait_for(lambda: len(pods(api, "web")) == 1)

    apps.patch_namespaced_deployment_scale("web", NS, {"spec": {"replicas": 4}})

    wait_for(lambda: len(pods(api, "web")) == 4, what="four pods")
    scale = wait_for(
        lambda: (s := apps.read_namespaced_deployment_scale("web", NS)).status.replicas == 4 and s
    )
    assert scale.spec.replicas == 4 and scale.status.selector == "app=web"
    assert apps.read_namespaced_deployment("web", NS).spec.replicas == 4

    apps.patch_namespaced_deployment_scale("web", NS, {"spec": {"replicas": 1}})
    wait_for(lambda: len(pods(api, "web")) == 1, what="scaled back to one pod")


def test_a_replicaset_replaces_a_deleted_pod(api: client.ApiClient) -> None:
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    apps.create_namespaced_deployment(NS, deployment("keep", 2, IMAGE_V1))
    first = wait_for(lambda: len(p := pods(api, "keep")) == 2 and p)

    core.delete_namespaced_pod(first[0].metadata.name, NS)

    names = wait_for(
        lambda: (
            len(p := pods(api, "keep")) == 2
            and first[0].metadata.name not in {x.metadata.name for x in p}
            and p
        )
    )
    assert first[1].metadata.name in {p.metadata.name for p in names}


def test_deleting_a_deployment_collects_its_replicasets_and_pods(api: client.ApiClient) -> None:
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment(NS, deployment("gone", 2, IMAGE_V1))
    wait_for(lambda: len(pods(api, "gone")) == 2)

    apps.delete_namespaced_deployment("gone", NS)  # apps/v1 deletes dependents in background by default

    wait_for(lambda: replicasets(api, "gone") == {} and pods(api, "gone") == [], what="everything collected")


def statefulset(name: str, replicas: int, image: str) -> dict[str, Any]:
    body = deployment(name, replicas, image)
    body["kind"] = "StatefulSet"
    body["spec"]["serviceName"] = name
    return body


def test_a_statefulset_makes_ordered_pods_scales_down_from_the_top_and_rolls_out(
    api: client.ApiClient,
) -> None:
    apps = client.AppsV1Api(api)
    apps.create_namespaced_stateful_set(NS, statefulset("kv", 3, IMAGE_V1))

    first = wait_for(lambda: pods(api, "kv"), what="the first pod")
    assert [p.metadata.name for p in first] == ["kv-0"]  # the next waits until kv-0 runs and is ready
    with binding_scheduler(api):
        wait_for(
            lambda: apps.read_namespaced_stateful_set("kv", NS).status.ready_replicas == 3, what="3 ready"
        )
        live = {p.metadata.name: p for p in pods(api, "kv")}
        assert sorted(live) == ["kv-0", "kv-1", "kv-2"]
        assert live["kv-1"].spec.hostname == "kv-1" and live["kv-1"].spec.subdomain == "kv"
        assert live["kv-1"].metadata.labels["apps.kubernetes.io/pod-index"] == "1"

        apps.patch_namespaced_stateful_set("kv", NS, {"spec": {"replicas": 2}})
        wait_for(
            lambda: sorted(p.metadata.name for p in pods(api, "kv")) == ["kv-0", "kv-1"], what="kv-2 removed"
        )

        patch = {"spec": {"template": {"spec": {"containers": [{"name": "server", "image": IMAGE_V2}]}}}}
        apps.patch_namespaced_stateful_set("kv", NS, patch)
        done = wait_for(
            lambda: (
                (s := apps.read_namespaced_stateful_set("kv", NS)).status.updated_replicas == 2
                and s.status.ready_replicas == 2
                and s
            ),
            what="the rollout",
        )
    assert {p.spec.containers[0].image for p in pods(api, "kv")} == {IMAGE_V2}
    assert done.status.update_revision == done.status.current_revision
