"""The emulated API server, driven over HTTP by the official Kubernetes Python client."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tessera.devcluster.apiserver import ApiServer

pytestmark = pytest.mark.integration


def pod(
    name: str | None = None, *, labels: dict[str, str] | None = None, generate: str | None = None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"labels": labels or {}}
    if name:
        metadata["name"] = name
    if generate:
        metadata["generateName"] = generate
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "schedulerName": "tessera",
            "containers": [{"name": "main", "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"}],
        },
    }


def node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}}


def bind(core: client.CoreV1Api, name: str, node_name: str, namespace: str = "default") -> int:
    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name=name), target=client.V1ObjectReference(kind="Node", name=node_name)
    )
    response = core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False)
    return int(response.status)


def test_create_assigns_uid_resource_version_and_creation_timestamp(core: client.CoreV1Api) -> None:
    first = core.create_namespaced_pod("default", pod("a"))
    second = core.create_namespaced_pod("default", pod("b"))
    listing = core.list_namespaced_pod("default")

    assert first.metadata.uid and second.metadata.uid and first.metadata.uid != second.metadata.uid
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)
    assert first.metadata.creation_timestamp is not None
    assert int(listing.metadata.resource_version) >= int(second.metadata.resource_version)
    assert first.status.phase == "Pending"


def test_generate_name_gives_distinct_names_with_the_prefix(core: client.CoreV1Api) -> None:
    names = {core.create_namespaced_pod("default", pod(generate="worker-")).metadata.name for _ in range(5)}

    assert len(names) == 5
    assert all(re.fullmatch(r"worker-[a-z0-9]{5}", name) for name in names)


def test_missing_name_and_generate_name_is_invalid(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod("default", pod())
    assert caught.value.status == 422
    assert "generateName" in caught.value.body


@pytest.mark.parametrize(
    ("label_selector", "field_selector", "expected"),
    [
        ("app=web", None, {"web-1", "web-2"}),
        ("app!=web", None, {"db-1", "plain"}),
        ("app in (web,db)", None, {"web-1", "web-2", "db-1"}),
        ("app notin (web)", None, {"db-1", "plain"}),
        ("tier", None, {"web-1", "db-1"}),
        ("!tier", None, {"web-2", "plain"}),
        ("app=web,tier=front", None, {"web-1"}),
        (None, "metadata.name=db-1", {"db-1"}),
        (None, "spec.nodeName=gpu-0", {"web-2"}),
        (None, "spec.nodeName=", {"web-1", "db-1", "plain"}),
        ("app=web", "spec.nodeName!=gpu-0", {"web-1"}),
    ],
)
def test_label_and_field_selectors_filter_lists(
    core: client.CoreV1Api, label_selector: str | None, field_selector: str | None, expected: set[str]
) -> None:
    core.create_namespaced_pod("default", pod("web-1", labels={"app": "web", "tier": "front"}))
    core.create_namespaced_pod("default", pod("web-2", labels={"app": "web"}))
    core.create_namespaced_pod("default", pod("db-1", labels={"app": "db", "tier": "back"}))
    core.create_namespaced_pod("default", pod("plain"))
    bind(core, "web-2", "gpu-0")

    kwargs = {k: v for k, v in (("label_selector", label_selector), ("field_selector", field_selector)) if v}
    listed = core.list_namespaced_pod("default", **kwargs)

    assert {p.metadata.name for p in listed.items} == expected


def test_a_malformed_selector_is_a_bad_request(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        core.list_namespaced_pod("default", label_selector="app in web")
    assert caught.value.status == 400


def test_binding_is_201_then_409_when_already_bound(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))

    assert bind(core, "p", "gpu-0") == 201
    with pytest.raises(ApiException) as caught:
        bind(core, "p", "gpu-1")

    bound = core.read_namespaced_pod("p", "default")
    assert caught.value.status == 409
    assert bound.spec.node_name == "gpu-0"
    assert [c.type for c in bound.status.conditions] == ["PodScheduled"]


def test_binding_a_missing_pod_is_404_in_the_status_shape(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        bind(core, "ghost", "gpu-0")
    assert caught.value.status == 404
    assert '"kind":"Status"' in caught.value.body and '"reason":"NotFound"' in caught.value.body


def test_the_legacy_bindings_collection_binds_too(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name="p"), target=client.V1ObjectReference(name="n1")
    )
    response = core.create_namespaced_binding("default", body, _preload_content=False)

    assert response.status == 201
    assert core.read_namespaced_pod("p", "default").spec.node_name == "n1"


def test_a_bindings_annotations_are_written_onto_the_pod_with_its_node(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name="p", annotations={"example.com/gpus": "0,1"}),
        target=client.V1ObjectReference(kind="Node", name="gpu-0"),
    )
    core.create_namespaced_pod_binding("p", "default", body, _preload_content=False)

    bound = core.read_namespaced_pod("p", "default")
    assert bound.spec.node_name == "gpu-0"
    assert bound.metadata.annotations == {"example.com/gpus": "0,1"}


def test_a_binding_whose_uid_or_resource_version_is_not_the_pods_is_409(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod("p"))
    stale = [
        client.V1ObjectMeta(name="p", uid="another-uid"),
        client.V1ObjectMeta(name="p", resource_version=str(int(created.metadata.resource_version) - 1)),
    ]
    for metadata in stale:
        body = client.V1Binding(metadata=metadata, target=client.V1ObjectReference(kind="Node", name="gpu-0"))
        with pytest.raises(ApiException) as caught:
            core.create_namespaced_pod_binding("p", "default", body, _preload_content=False)
        assert caught.value.status == 409 and "Precondition failed" in caught.value.body
    assert core.read_namespaced_pod("p", "default").spec.node_name is None

    current = client.V1ObjectMeta(
        name="p", uid=created.metadata.uid, resource_version=created.metadata.resource_version
    )
    body = client.V1Binding(metadata=current, target=client.V1ObjectReference(kind="Node", name="gpu-0"))
    assert core.create_namespaced_pod_binding("p", "default", body, _preload_content=False).status == 201


def test_eviction_deletes_the_pod(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("victim"))
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="victim", namespace="default"))

    response = core.create_namespaced_pod_eviction("victim", "default", eviction, _preload_content=False)

    assert response.status == 201
    with pytest.raises(ApiException) as caught:
        core.read_namespaced_pod("victim", "default")
    assert caught.value.status == 404


def test_put_replaces_and_a_stale_resource_version_is_409(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_config_map("default", {"metadata": {"name": "cfg"}, "data": {"a": "1"}})
    created.data = {"b": "2"}
    replaced = core.replace_namespaced_config_map("cfg", "default", created)

    assert replaced.data == {"b": "2"}
    assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)
    with pytest.raises(ApiException) as caught:
        core.replace_namespaced_config_map("cfg", "default", created)  # still carries the old version
    assert caught.value.status == 409
    assert core.read_namespaced_config_map("cfg", "default").data == {"b": "2"}


def test_merge_and_strategic_patches_change_labels_and_unschedulable(core: client.CoreV1Api) -> None:
    core.create_node(node("n1", {"keep": "yes", "drop": "me"}))

    core.patch_node(
        "n1", {"metadata": {"labels": {"drop": None, "new": "1"}}, "spec": {"unschedulable": True}}
    )
    patched = core.read_node("n1")

    assert patched.metadata.labels == {"keep": "yes", "new": "1"}
    assert patched.spec.unschedulable is True


def test_status_subresource_is_the_only_way_to_change_status(core: client.CoreV1Api) -> None:
    core.create_node(node("n1"))
    core.patch_node("n1", {"status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    assert core.read_node("n1").status.allocatable is None

    core.patch_node_status("n1", {"status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    assert core.read_node("n1").status.allocatable == {"nvidia.com/gpu": "8"}


def test_pod_updates_may_not_change_node_name(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("p", "default", {"spec": {"nodeName": "n1"}})
    assert caught.value.status == 422


def test_delete_of_a_missing_object_is_404(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        core.delete_namespaced_pod("ghost", "default")
    assert caught.value.status == 404


@pytest.mark.parametrize("policy", ["Foreground", "Orphan", "Background"])
@pytest.mark.parametrize("precondition", ["uid", "resource_version"])
def test_a_delete_refused_by_its_precondition_changes_neither_the_owner_nor_its_dependents(
    api_client: client.ApiClient, policy: str, precondition: str
) -> None:
    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    job = batch.create_namespaced_job(
        "default",
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "j"},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c"}]}}},
        },
    )
    reference = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": "j",
        "uid": job.metadata.uid,
        "controller": True,
    }
    for name in ("p1", "p2"):
        core.create_namespaced_pod(
            "default", {**pod(name), "metadata": {"name": name, "ownerReferences": [reference]}}
        )
    before = core.list_namespaced_pod("default")

    stale = client.V1Preconditions(**{precondition: "999"})
    with pytest.raises(ApiException) as caught:
        batch.delete_namespaced_job(
            "j", "default", body=client.V1DeleteOptions(propagation_policy=policy, preconditions=stale)
        )

    assert caught.value.status == 409
    after = core.list_namespaced_pod("default")
    assert (
        batch.read_namespaced_job("j", "default").metadata.resource_version == job.metadata.resource_version
    )
    assert [(p.metadata.name, p.metadata.resource_version) for p in after.items] == [
        (p.metadata.name, p.metadata.resource_version) for p in before.items
    ]
    assert after.metadata.resource_version == before.metadata.resource_version  # nothing was written
    assert all(p.metadata.owner_references[0].uid == job.metadata.uid for p in after.items)


def test_finalizers_hold_deletion_until_removed(core: client.CoreV1Api) -> None:
    body = pod("held")
    body["metadata"]["finalizers"] = ["tessera.io/checkpoint"]
    core.create_namespaced_pod("default", body)

    core.delete_namespaced_pod("held", "default")
    assert core.read_namespaced_pod("held", "default").metadata.deletion_timestamp is not None
    core.patch_namespaced_pod("held", "default", {"metadata": {"finalizers": None}})

    with pytest.raises(ApiException) as caught:
        core.read_namespaced_pod("held", "default")
    assert caught.value.status == 404


def test_watch_ends_after_timeout_seconds(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("existing"))

    # The stream ends on the server's side: list() returns instead of blocking until the test times out.
    events = list(watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=1))

    assert [(e["type"], e["object"].metadata.name) for e in events] == [("ADDED", "existing")]


def test_watch_resumes_after_a_resource_version(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("before"))
    since = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", pod("after"))
    core.patch_namespaced_pod("after", "default", {"metadata": {"labels": {"x": "1"}}})
    core.delete_namespaced_pod("before", "default")

    events = watch.Watch().stream(
        core.list_namespaced_pod, "default", resource_version=since, timeout_seconds=1
    )
    seen = [(e["type"], e["object"].metadata.name) for e in events]

    assert seen == [("ADDED", "after"), ("MODIFIED", "after"), ("DELETED", "before")]


def test_watch_from_a_compacted_resource_version_is_410_gone() -> None:
    server = ApiServer(history=3)
    server.start()
    try:
        configuration = client.Configuration()
        configuration.host = server.url
        core = client.CoreV1Api(client.ApiClient(configuration))
        first = core.create_namespaced_pod("default", pod("p0"))
        for i in range(1, 6):
            core.create_namespaced_pod("default", pod(f"p{i}"))

        with pytest.raises(ApiException) as caught:
            list(
                watch.Watch().stream(
                    core.list_namespaced_pod,
                    "default",
                    resource_version=first.metadata.resource_version,
                    timeout_seconds=1,
                )
            )
        assert caught.value.status == 410
    finally:
        server.stop()


def test_watch_sees_objects_created_without_metadata_namespace(core: client.CoreV1Api) -> None:
    seen: list[tuple[str, str, str]] = []
    watcher = watch.Watch()

    def consume() -> None:
        for event in watcher.stream(core.list_namespaced_pod, "team-a", timeout_seconds=3):
            seen.append((event["type"], event["object"].metadata.name, event["object"].metadata.namespace))
            watcher.stop()

    thread = threading.Thread(target=consume)
    thread.start()
    time.sleep(0.3)
    created = core.create_namespaced_pod("team-a", pod("no-ns"))  # the body carries no namespace
    thread.join(10)

    assert created.metadata.namespace == "team-a"
    assert seen == [("ADDED", "no-ns", "team-a")]


def test_watch_with_a_selector_reports_objects_leaving_it_as_deleted(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p", labels={"app": "web"}))
    since = core.list_namespaced_pod("default").metadata.resource_version
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"app": "db"}}})

    events = watch.Watch().stream(
        core.list_namespaced_pod,
        "default",
        label_selector="app=web",
        resource_version=since,
        timeout_seconds=1,
    )

    assert [(e["type"], e["object"].metadata.name) for e in events] == [("DELETED", "p")]


def test_discovery_lists_core_and_podgroup_resources(api_client: client.ApiClient) -> None:
    core_resources = client.CoreV1Api(api_client).get_api_resources()
    groups = client.ApisApi(api_client).get_api_versions()
    version = client.VersionApi(api_client).get_code()

    names = {r.name for r in core_resources.resources}
    assert {"pods", "pods/binding", "pods/eviction", "pods/status", "nodes", "nodes/status"} <= names
    assert "scheduling.x-k8s.io" in {g.name for g in groups.groups}
    assert version.major == "1"


def test_podgroups_are_served_as_a_custom_resource(api_client: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api_client)
    group = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "train"},
        "spec": {"minMember": 4},
    }
    custom.create_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", "default", "podgroups", group)
    custom.patch_namespaced_custom_object_status(
        "scheduling.x-k8s.io", "v1alpha1", "default", "podgroups", "train", {"status": {"phase": "Scheduled"}}
    )

    stored = custom.get_namespaced_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", "default", "podgroups", "train"
    )
    assert stored["spec"]["minMember"] == 4
    assert stored["status"]["phase"] == "Scheduled"


def test_several_servers_in_one_process_stop_in_any_order() -> None:
    first, second = ApiServer(), ApiServer()
    first.start()
    second.start()
    first.stop()

    configuration = client.Configuration()
    configuration.host = second.url
    version = client.VersionApi(client.ApiClient(configuration)).get_code()
    second.stop()

    assert version.git_version.endswith("tessera-devcluster")
