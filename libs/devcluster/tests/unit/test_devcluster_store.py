"""The versioned object store: resourceVersions, names, conflicts, bindings and watch history."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tessera.devcluster.apiserver.errors import ApiError
from tessera.devcluster.apiserver.resources import CONFIGMAPS, JOBS, NODES, PODS
from tessera.devcluster.apiserver.selectors import Selector
from tessera.devcluster.apiserver.store import ObjectStore


def pod(name: str, **labels: str) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": labels}, "spec": {"containers": [{"name": "c"}]}}


def test_every_write_takes_the_next_global_resource_version() -> None:
    store = ObjectStore()
    a = store.create(PODS, "ns", pod("a"))
    node = store.create(NODES, None, {"metadata": {"name": "n"}})
    b = store.mutate(PODS, "ns", "a", lambda p: p["metadata"]["labels"].update(x="1"))

    versions = [int(o["metadata"]["resourceVersion"]) for o in (a, node, b)]
    assert versions == sorted(versions) and len(set(versions)) == 3
    assert store.revision == versions[-1]
    assert b["metadata"]["uid"] == a["metadata"]["uid"]


def test_a_no_op_write_keeps_the_resource_version() -> None:
    store = ObjectStore()
    created = store.create(CONFIGMAPS, "ns", {"metadata": {"name": "c"}, "data": {"k": "v"}})

    same = store.patch(CONFIGMAPS, "ns", "c", {"data": {"k": "v"}}, "application/merge-patch+json")

    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_create_twice_is_409_already_exists() -> None:
    store = ObjectStore()
    store.create(PODS, "ns", pod("a"))
    with pytest.raises(ApiError) as caught:
        store.create(PODS, "ns", pod("a"))
    assert (caught.value.code, caught.value.reason) == (409, "AlreadyExists")


@pytest.mark.parametrize("name", ["Upper", "under_score", "-lead", "x" * 254])
def test_invalid_names_are_422(name: str) -> None:
    with pytest.raises(ApiError) as caught:
        ObjectStore().create(PODS, "ns", pod(name))
    assert caught.value.code == 422 and "metadata.name" in caught.value.message


def test_namespace_in_the_body_must_match_the_url() -> None:
    body = pod("a")
    body["metadata"]["namespace"] = "other"  # type: ignore[index]
    with pytest.raises(ApiError) as caught:
        ObjectStore().create(PODS, "ns", body)
    assert caught.value.code == 400


def test_replace_with_a_stale_resource_version_is_409_and_without_one_wins() -> None:
    store = ObjectStore()
    old = store.create(CONFIGMAPS, "ns", {"metadata": {"name": "c"}, "data": {"v": "1"}})
    store.mutate(CONFIGMAPS, "ns", "c", lambda c: c["data"].update(v="2"))

    with pytest.raises(ApiError) as caught:
        store.replace(CONFIGMAPS, "ns", "c", {**old, "data": {"v": "3"}})
    unconditional = store.replace(CONFIGMAPS, "ns", "c", {"metadata": {"name": "c"}, "data": {"v": "4"}})

    assert caught.value.code == 409
    assert unconditional["data"] == {"v": "4"}


def test_bind_once_then_conflict() -> None:
    store = ObjectStore()
    store.create(PODS, "ns", pod("a"))

    bound = store.bind("ns", "a", "n1")
    with pytest.raises(ApiError) as caught:
        store.bind("ns", "a", "n2")

    assert bound["spec"]["nodeName"] == "n1"
    assert caught.value.code == 409 and 'already assigned to node "n1"' in caught.value.message


def test_a_pod_held_by_scheduling_gates_cannot_be_bound_until_they_are_removed() -> None:
    store = ObjectStore()
    gated = pod("a")
    gated["spec"] = {"containers": [{"name": "c"}], "schedulingGates": [{"name": "tessera.io/admission"}]}
    store.create(PODS, "ns", gated)

    with pytest.raises(ApiError) as caught:
        store.bind("ns", "a", "n1")
    assert caught.value.code == 409 and "non-empty .spec.schedulingGates" in caught.value.message

    store.mutate(PODS, "ns", "a", lambda p: p["spec"].update(schedulingGates=[]))
    assert store.bind("ns", "a", "n1")["spec"]["nodeName"] == "n1"


def test_scheduling_gates_may_only_be_removed_and_a_gated_pod_may_only_gain_node_selector_keys() -> None:
    store = ObjectStore()
    gate = {"name": "tessera.io/admission"}
    gated = pod("a")
    gated["spec"] = {"containers": [{"name": "c"}], "nodeSelector": {"zone": "a"}, "schedulingGates": [gate]}
    store.create(PODS, "ns", gated)

    def patch(spec: dict[str, Any]) -> dict[str, Any]:
        return store.patch(PODS, "ns", "a", {"spec": spec}, "application/merge-patch+json")

    with pytest.raises(ApiError) as added:
        patch({"schedulingGates": [gate, {"name": "example.com/other"}]})
    assert added.value.code == 422 and "new scheduling gate 'example.com/other'" in added.value.message
    with pytest.raises(ApiError) as changed:
        patch({"nodeSelector": {"zone": "b"}})
    assert changed.value.code == 422 and "only additions to spec.nodeSelector" in changed.value.message

    patch({"nodeSelector": {"pool": "gpu"}})
    patch({"schedulingGates": []})
    with pytest.raises(ApiError) as ungated:
        patch({"nodeSelector": {"rack": "r1"}})
    assert ungated.value.code == 422 and "once ungated" in ungated.value.message
    assert store.get(PODS, "ns", "a")["spec"]["nodeSelector"] == {"zone": "a", "pool": "gpu"}


async def test_watch_replays_history_after_a_resource_version() -> None:
    store = ObjectStore()
    store.create(PODS, "ns", pod("a", app="web"))
    since = str(store.revision)
    store.create(PODS, "ns", pod("b", app="web"))
    store.create(PODS, "other", pod("c", app="web"))
    store.delete(PODS, "ns", "a")

    watch = store.watch(PODS, "ns", Selector.parse("app=web", None), since)
    events = [await watch.next(0.1) for _ in range(3)]
    watch.close()

    assert [(e["type"], e["object"]["metadata"]["name"]) if e else None for e in events] == [
        ("ADDED", "b"),
        ("DELETED", "a"),
        None,
    ]


async def test_watch_from_a_compacted_revision_is_410() -> None:
    store = ObjectStore(history=2)
    first = store.create(PODS, "ns", pod("a"))
    for name in ("b", "c", "d"):
        store.create(PODS, "ns", pod(name))

    with pytest.raises(ApiError) as caught:
        store.watch(PODS, "ns", resource_version=first["metadata"]["resourceVersion"])
    recent = store.watch(PODS, "ns", resource_version=str(store.revision - 1))

    assert caught.value.code == 410
    assert (await recent.next(0.1) or {}).get("object", {}).get("metadata", {}).get("name") == "d"
    recent.close()


async def test_closing_the_store_watches_ends_them() -> None:
    store = ObjectStore()
    watch = store.watch(PODS)

    store.close_watches()

    assert await watch.next(1.0) is None and watch.closed


def test_the_owner_index_follows_owner_references_through_writes_and_deletes() -> None:
    store = ObjectStore()
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u-1", "controller": True}
    store.create(PODS, "ns", {"metadata": {"name": "b", "ownerReferences": [owner]}})
    store.create(PODS, "ns", {"metadata": {"name": "a", "ownerReferences": [owner]}})
    store.create(PODS, "ns", {"metadata": {"name": "stray"}})

    assert [p["metadata"]["name"] for p in store.owned_by("u-1", PODS)] == ["a", "b"]
    assert store.owned_by("u-1", JOBS) == []

    store.patch(PODS, "ns", "b", {"metadata": {"ownerReferences": None}}, "application/merge-patch+json")
    store.delete(PODS, "ns", "a")
    store.patch(
        PODS, "ns", "stray", {"metadata": {"ownerReferences": [owner]}}, "application/merge-patch+json"
    )

    assert [(t.plural, o["metadata"]["name"]) for t, o in store.owned_keys("u-1")] == [("pods", "stray")]


def configmap(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "data": {}}


async def test_a_watch_from_a_resource_version_the_store_has_not_reached_is_410() -> None:
    store = ObjectStore()
    store.create(CONFIGMAPS, "ns", configmap("a"))

    with pytest.raises(ApiError) as caught:
        store.watch(CONFIGMAPS, "ns", resource_version=str(store.revision + 1))

    assert caught.value.code == 410 and "Too large resource version" in caught.value.message


async def test_a_store_restored_after_a_crash_never_reuses_a_resource_version_it_may_have_handed_out() -> (
    None
):
    # A devcluster killed between two snapshots: the writes after the last one are lost, but a
    # watcher saw them. The revisions were reserved (recorded ahead of use) before they were used.
    reserved: list[int] = []
    before = ObjectStore()
    before.reserve_revisions(reserved.append, block=10)
    before.create(CONFIGMAPS, "ns", configmap("a"))
    revision, objects = before.contents()
    snapshot = (revision, copy.deepcopy(objects))
    before.create(CONFIGMAPS, "ns", configmap("ghost"))
    before.create(CONFIGMAPS, "ns", configmap("ghost2"))
    seen = str(before.revision)  # what a reflector had seen when the devcluster died

    after = ObjectStore()
    after.restore(*snapshot)
    after.resume_after(reserved[-1])
    written = [after.create(CONFIGMAPS, "ns", configmap(name)) for name in ("b", "c", "d")]

    handed_out = {str(v) for v in range(1, reserved[-1] + 1)}
    assert not handed_out & {o["metadata"]["resourceVersion"] for o in written}
    for since in (seen, str(revision), "1"):  # the lost window, the snapshot's revision, older still
        with pytest.raises(ApiError) as caught:
            after.watch(CONFIGMAPS, "ns", resource_version=since)
        assert caught.value.code == 410, since
    # the reflector relists and watches on from the list's version
    items, listed = after.list(CONFIGMAPS, "ns")
    assert [o["metadata"]["name"] for o in items] == ["a", "b", "c", "d"]
    watch = after.watch(CONFIGMAPS, "ns", resource_version=str(listed))
    after.delete(CONFIGMAPS, "ns", "a")
    event = await watch.next(0.1)
    watch.close()
    assert event is not None and (event["type"], event["object"]["metadata"]["name"]) == ("DELETED", "a")


async def test_a_restored_store_may_be_watched_from_the_version_a_list_gives_before_any_write() -> None:
    before = ObjectStore()
    before.create(CONFIGMAPS, "ns", configmap("a"))
    revision, objects = before.contents()

    after = ObjectStore()
    after.restore(revision, copy.deepcopy(objects))
    after.resume_after(revision + 5)
    _, listed = after.list(CONFIGMAPS, "ns")
    watch = after.watch(CONFIGMAPS, "ns", resource_version=str(listed))  # no 410: no relist loop
    after.create(CONFIGMAPS, "ns", configmap("b"))
    event = await watch.next(0.1)
    watch.close()

    assert listed > revision + 5
    assert event is not None and event["object"]["metadata"]["name"] == "b"


def test_revisions_are_reserved_a_block_at_a_time_before_they_are_used() -> None:
    store = ObjectStore()
    reserved: list[tuple[int, int]] = []  # (the ceiling, the store's revision when it was reserved)
    store.reserve_revisions(lambda ceiling: reserved.append((ceiling, store.revision)), block=10)

    for i in range(25):
        store.create(CONFIGMAPS, "ns", configmap(f"c{i}"))
    store.delete(CONFIGMAPS, "ns", "c0")

    assert reserved == [(10, 0), (20, 10), (30, 20)]
    assert store.revision == 26


def test_mutate_without_a_copy_gives_the_stored_object_and_with_one_a_copy() -> None:
    store = ObjectStore()
    store.create(PODS, "ns", pod("a"))

    kept = store.mutate(PODS, "ns", "a", lambda p: p["metadata"]["labels"].update(x="1"), copy_result=False)
    same = store.mutate(PODS, "ns", "a", lambda p: None, copy_result=False)  # a no-op writes nothing
    copied = store.mutate(PODS, "ns", "a", lambda p: p["metadata"]["labels"].update(x="2"))

    assert kept["metadata"]["labels"] == {"x": "1"} and same is kept
    copied["metadata"]["labels"]["x"] = "3"  # the caller's own copy
    assert store.get(PODS, "ns", "a")["metadata"]["labels"] == {"x": "2"}


def test_bind_without_a_copy_gives_the_stored_pod() -> None:
    store = ObjectStore()
    store.create(PODS, "ns", pod("a"))
    store.create(PODS, "ns", pod("b"))

    kept = store.bind("ns", "a", "n1", copy_result=False)
    copied = store.bind("ns", "b", "n1")
    copied["spec"]["nodeName"] = "elsewhere"  # the caller's own copy

    assert kept["spec"]["nodeName"] == "n1"
    assert any(obj is kept for _, obj in store.contents()[1])
    assert store.get(PODS, "ns", "b")["spec"]["nodeName"] == "n1"
