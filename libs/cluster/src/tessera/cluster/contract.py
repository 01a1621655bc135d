"""The behaviour every `Cluster` implementation must show, as checks run against a harness.

The same checks run on the FakeCluster (unit tests) and on the Kubernetes adapter against the
devcluster's emulated API server (integration tests), so the fake cannot drift from the real thing.
A harness gives the checks a cluster and a way to act as "someone else" on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from tessera.cluster.builders import PodManifest, gfd_node_manifest, pod_group_manifest
from tessera.cluster.cache import ClusterCache, pod_key
from tessera.cluster.conventions.names import MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.domain.node import MigConfigState
from tessera.cluster.domain.requirements import Pod, PodRef
from tessera.cluster.port import (
    AlreadyBound,
    Cluster,
    Conflict,
    EventType,
    NotFound,
    PodSelector,
    Unparseable,
    WatchEvent,
    WatchExpired,
)
from tessera.cluster.reflector import Reflector

T = TypeVar("T")
WAIT = 10.0


class ClusterHarness(Protocol):
    cluster: Cluster

    async def add_node(self, manifest: dict[str, Any]) -> None: ...

    async def add_pod(self, manifest: dict[str, Any]) -> None: ...

    async def add_pod_group(self, manifest: dict[str, Any]) -> None: ...

    async def delete_pod(self, ref: PodRef) -> None: ...

    async def write_config_map(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        """Another writer replaces the ConfigMap's data."""
        ...

    async def end_watches(self) -> None:
        """The server closes every open watch stream (as on its timeout)."""
        ...

    async def expire_history(self) -> None:
        """Every resourceVersion handed out so far becomes too old to watch from (410 Gone)."""
        ...


async def _take(stream: AsyncIterator[WatchEvent[T | Unparseable]], count: int) -> list[WatchEvent[T]]:
    events: list[WatchEvent[T]] = []
    async with asyncio.timeout(WAIT):
        async for event in stream:
            item = event.object
            assert not isinstance(item, Unparseable), f"a well-formed object did not parse: {item}"
            events.append(WatchEvent(event.type, item, event.resource_version))
            if len(events) == count:
                break
    return events


async def _close(stream: AsyncIterator[Any]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


def _pending(name: str, namespace: str = "default") -> dict[str, Any]:
    return PodManifest(name, namespace).scheduler().requests(cpu="1", memory="1Gi").gpus(1).obj()


async def nodes_are_listed_and_watched(h: ClusterHarness) -> None:
    await h.add_node(gfd_node_manifest("gpu-a", "NVIDIA-A100-SXM4-80GB", 8, 81920))
    await h.add_node(gfd_node_manifest("gpu-b", "Tesla-T4", 4, 15360))
    listing = await h.cluster.list_nodes()
    nodes = {node.name: node for node in listing.items}
    assert set(nodes) == {"gpu-a", "gpu-b"}, nodes
    assert nodes["gpu-a"].gpu_count == 8 and nodes["gpu-a"].gpus[0].model == "A100-80GB"
    stream = h.cluster.watch_nodes(listing.resource_version)
    await h.add_node(gfd_node_manifest("gpu-c", "NVIDIA-L4", 1, 23034))
    await h.cluster.patch_node("gpu-a", labels={"pool": "train"})
    try:
        events = await _take(stream, 2)
    finally:
        await _close(stream)
    assert [(e.type, e.object.name) for e in events] == [
        (EventType.ADDED, "gpu-c"),
        (EventType.MODIFIED, "gpu-a"),
    ]
    assert events[1].object.labels["pool"] == "train"
    assert int(events[1].resource_version) > int(events[0].resource_version)


async def pending_pods_are_selected_by_scheduler_and_node(h: ClusterHarness) -> None:
    await h.add_pod(_pending("a"))
    await h.add_pod(PodManifest("b").scheduler().on_node("gpu-a").obj())
    await h.add_pod(PodManifest("c").obj())
    await h.add_pod(_pending("d", "team"))
    listing = await h.cluster.list_pods(PodSelector.pending_for())
    assert sorted(str(p.ref) for p in listing.items) == ["default/a", "team/d"]
    only_default = await h.cluster.list_pods(PodSelector.pending_for(namespace="default"))
    assert [p.name for p in only_default.items] == ["a"]
    on_node = await h.cluster.list_pods(PodSelector(node_name="gpu-a"))
    assert [p.name for p in on_node.items] == ["b"]
    assigned = await h.cluster.list_pods(PodSelector.holding_resources())
    assert [p.name for p in assigned.items] == ["b"]
    stream = h.cluster.watch_pods(listing.resource_version, PodSelector.pending_for())
    try:
        await h.add_pod(_pending("e"))
        await h.cluster.bind(PodRef("default", "a"), "gpu-a")
        await h.add_pod(PodManifest("f").obj())
        await h.add_pod(_pending("g"))
        events = await _take(stream, 3)
    finally:
        await _close(stream)
    seen = [(e.type, e.object.name) for e in events]
    # Bound, "a" leaves the selector: its watcher sees it DELETED. "f" is not ours: never seen.
    assert seen == [(EventType.ADDED, "e"), (EventType.DELETED, "a"), (EventType.ADDED, "g")], seen
    assert events[0].object.requirements.gpu.count == 1


async def pod_groups_are_listed_and_watched(h: ClusterHarness) -> None:
    await h.add_pod_group(pod_group_manifest("train", 4))
    listing = await h.cluster.list_pod_groups()
    assert [(g.key, g.min_member) for g in listing.items] == [("default/train", 4)]
    stream = h.cluster.watch_pod_groups(listing.resource_version)
    try:
        await h.add_pod_group(pod_group_manifest("serve", 2, "team"))
        (event,) = await _take(stream, 1)
    finally:
        await _close(stream)
    assert (event.type, event.object.key, event.object.min_member) == (EventType.ADDED, "team/serve", 2)
    assert [g.name for g in (await h.cluster.list_pod_groups("team")).items] == ["serve"]


async def binding_writes_the_assignment_and_refuses_a_second_binding(h: ClusterHarness) -> None:
    await h.add_pod(_pending("w0"))
    ref = PodRef("default", "w0")
    assignment = DeviceAssignment("gpu-a", (GpuShare("GPU-gpu-a-3", 1000),))
    await h.cluster.bind(ref, "gpu-a", assignment)
    pod = await h.cluster.get_pod(ref)
    assert pod.node_name == "gpu-a"
    assert pod.assignment == assignment
    try:
        await h.cluster.bind(ref, "gpu-b")
    except AlreadyBound:
        pass
    else:
        raise AssertionError("a second binding must be refused with 409")
    assert (await h.cluster.get_pod(ref)).node_name == "gpu-a"
    try:
        await h.cluster.bind(PodRef("default", "missing"), "gpu-a")
    except NotFound:
        pass
    else:
        raise AssertionError("binding a missing pod must be NotFound")


async def binding_names_the_pod_s_uid_and_refuses_another_pod_of_its_name(h: ClusterHarness) -> None:
    """The uid the assignment names is the Binding's precondition (``metadata.uid``): a pod made
    again under the same name is not bound with an assignment written for the one before it."""
    await h.add_pod(_pending("w1"))
    ref = PodRef("default", "w1")
    uid = (await h.cluster.get_pod(ref)).uid
    stale = DeviceAssignment("gpu-a", (GpuShare("GPU-gpu-a-3", 1000),), f"{uid}-before")
    try:
        await h.cluster.bind(ref, "gpu-a", stale)
    except AlreadyBound as error:
        raise AssertionError("another uid is a failed precondition, not a pod already bound") from error
    except Conflict:
        pass
    else:
        raise AssertionError("a Binding naming another uid must be refused with 409")
    pod = await h.cluster.get_pod(ref)
    assert pod.node_name is None and pod.assignment is None, "nothing written"
    own = DeviceAssignment("gpu-a", (GpuShare("GPU-gpu-a-3", 1000),), uid or None)
    await h.cluster.bind(ref, "gpu-a", own)
    pod = await h.cluster.get_pod(ref)
    assert pod.node_name == "gpu-a" and pod.assignment == own


async def eviction_removes_the_pod(h: ClusterHarness) -> None:
    await h.add_pod(PodManifest("victim").scheduler().on_node("gpu-a").obj())
    ref = PodRef("default", "victim")
    await h.cluster.evict(ref, grace_period_seconds=0)
    for attempt in (h.cluster.get_pod(ref), h.cluster.evict(ref)):
        try:
            await attempt
        except NotFound:
            continue
        raise AssertionError("an evicted pod must be gone")


async def node_labels_annotations_and_cordon_are_patched(h: ClusterHarness) -> None:
    await h.add_node(gfd_node_manifest("gpu-m", "NVIDIA-A100-SXM4-80GB", 2, 81920))
    node = await h.cluster.patch_node(
        "gpu-m",
        labels={MIG_CONFIG_LABEL: "all-balanced", MIG_CONFIG_STATE_LABEL: "pending"},
        annotations={"tessera.io/note": "reslicing"},
    )
    assert (node.mig_config, node.mig_config_state) == ("all-balanced", MigConfigState.PENDING)
    assert node.annotations["tessera.io/note"] == "reslicing"
    node = await h.cluster.patch_node("gpu-m", labels={MIG_CONFIG_STATE_LABEL: None})
    assert node.mig_config_state is None and MIG_CONFIG_STATE_LABEL not in node.labels
    assert (await h.cluster.cordon("gpu-m")).unschedulable
    assert not (await h.cluster.cordon("gpu-m", unschedulable=False)).unschedulable


async def config_maps_are_applied_and_updates_retry_on_conflict(h: ClusterHarness) -> None:
    ns, name = "default", "device-plugin-config"
    assert await h.cluster.get_config_map(ns, name) is None
    created = await h.cluster.apply_config_map(
        ns, name, {"default": "version: v1\n"}, labels={"app": "tessera"}
    )
    replaced = await h.cluster.apply_config_map(ns, name, {"default": "version: v1\n", "ts-4": "x"})
    assert replaced.data == {"default": "version: v1\n", "ts-4": "x"}
    assert replaced.labels == {"app": "tessera"}
    assert replaced.resource_version != created.resource_version
    calls: list[dict[str, str]] = []

    async def add_ours(current: Mapping[str, str]) -> Mapping[str, str]:
        calls.append(dict(current))
        if len(calls) == 1:  # someone else writes between our read and our write
            await h.write_config_map(ns, name, {**current, "theirs": "1"})
        return {**current, "ours": "2"}

    final = await h.cluster.update_config_map(ns, name, add_ours)
    assert len(calls) == 2, calls
    assert "theirs" in calls[1]
    assert final.data == {"default": "version: v1\n", "ts-4": "x", "theirs": "1", "ours": "2"}
    stored = await h.cluster.get_config_map(ns, name)
    assert stored is not None and stored.data == final.data


def _pod_reflector(h: ClusterHarness) -> Reflector[Pod]:
    return Reflector(
        "pods",
        lambda: h.cluster.list_pods(),
        lambda rv: h.cluster.watch_pods(rv),
        key=pod_key,
        retry_delay=0.05,
    )


async def _run_until(reflector: Reflector[Any], body: Callable[[], Awaitable[None]]) -> None:
    task = asyncio.create_task(reflector.run())
    try:
        async with asyncio.timeout(WAIT):
            await reflector.synced.wait()
        await body()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def an_ended_watch_is_resumed_from_the_last_version(h: ClusterHarness) -> None:
    await h.add_pod(_pending("r0"))
    reflector = _pod_reflector(h)

    async def body() -> None:
        await h.add_pod(_pending("r1"))  # seen through the watch: the stream is open
        await reflector.wait_for(lambda store: "default/r1" in store, WAIT)
        await h.end_watches()
        await h.add_pod(_pending("r2"))
        await reflector.wait_for(lambda store: "default/r2" in store, WAIT)

    await _run_until(reflector, body)
    assert set(reflector.store) == {"default/r0", "default/r1", "default/r2"}
    assert reflector.lists == 1, "a resumed watch must not relist"
    assert reflector.resumes >= 1


async def an_expired_watch_relists_and_reports_the_gap(h: ClusterHarness) -> None:
    await h.add_pod(_pending("x0"))
    await h.add_pod(_pending("x1"))
    reflector = _pod_reflector(h)
    seen: list[tuple[EventType, str]] = []
    reflector.subscribe(lambda event: seen.append((event.type, event.object.name)))
    await _run_until(reflector, lambda: asyncio.sleep(0))
    # While the reflector is down, the cluster moves on and the history is compacted.
    await h.delete_pod(PodRef("default", "x0"))
    await h.add_pod(_pending("x2"))
    await h.expire_history()
    seen.clear()

    async def body() -> None:
        await reflector.wait_for(lambda store: set(store) == {"default/x1", "default/x2"}, WAIT)

    await _run_until(reflector, body)
    assert reflector.lists == 2, "an expired watch must relist"
    assert (EventType.DELETED, "x0") in seen and (EventType.ADDED, "x2") in seen, seen


async def a_watch_from_a_compacted_version_is_expired(h: ClusterHarness) -> None:
    await h.add_pod(_pending("old"))
    listing = await h.cluster.list_pods()
    await h.add_pod(_pending("new"))
    await h.expire_history()
    stream = h.cluster.watch_pods(listing.resource_version)
    try:
        await _take(stream, 1)
    except WatchExpired:
        return
    finally:
        await _close(stream)
    raise AssertionError("watching from a compacted resourceVersion must raise WatchExpired")


async def the_cache_snapshot_follows_the_cluster(h: ClusterHarness) -> None:
    await h.add_node(gfd_node_manifest("gpu-s", "NVIDIA-H100-80GB-HBM3", 8, 81559))
    await h.add_pod_group(pod_group_manifest("gang", 2))
    await h.add_pod(PodManifest("m0").scheduler().group("gang").gpus(4).obj())
    async with ClusterCache(h.cluster) as cache:
        await h.add_pod(PodManifest("m1").scheduler().group("gang").gpus(4).obj())
        await cache.pods.wait_for(lambda store: len(store) == 2, WAIT)
        snapshot = cache.snapshot()
        assignment = DeviceAssignment("gpu-s", tuple(GpuShare(f"GPU-gpu-s-{i}") for i in range(4)))
        await h.cluster.bind(PodRef("default", "m0"), "gpu-s", assignment)
        await cache.pods.wait_for(lambda store: "default/m0" not in store, WAIT)
        assert cache.bound_pods is not None
        await cache.bound_pods.wait_for(lambda store: "default/m0" in store, WAIT)
        after = cache.snapshot()
    assert [a.pod for a in after.allocations_on("gpu-s")] == ["m0"]
    assert after.allocations_on("gpu-s")[0].assignment == assignment
    assert set(after.pods) == {"default/m1"}
    assert set(snapshot.nodes) == {"gpu-s"}
    assert [p.name for p in sorted(snapshot.pods_in_group("default", "gang"), key=lambda p: p.name)] == [
        "m0",
        "m1",
    ]
    assert snapshot.pod_groups["default/gang"].min_member == 2
    assert "default/m0" in snapshot.pods, "a snapshot must not change after it is taken"


CHECKS: tuple[Callable[[ClusterHarness], Awaitable[None]], ...] = (
    nodes_are_listed_and_watched,
    pending_pods_are_selected_by_scheduler_and_node,
    pod_groups_are_listed_and_watched,
    binding_writes_the_assignment_and_refuses_a_second_binding,
    binding_names_the_pod_s_uid_and_refuses_another_pod_of_its_name,
    eviction_removes_the_pod,
    node_labels_annotations_and_cordon_are_patched,
    config_maps_are_applied_and_updates_retry_on_conflict,
    an_ended_watch_is_resumed_from_the_last_version,
    an_expired_watch_relists_and_reports_the_gap,
    a_watch_from_a_compacted_version_is_expired,
    the_cache_snapshot_follows_the_cluster,
)
