"""FakeCluster hooks beyond the contract, the reflector's error handling, and the retry helper."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

import pytest

from tessera.cluster.conventions import GPU_ASSIGNMENT_ANNOTATION
from tessera.cluster.domain import DeviceAssignment, GpuShare, Node, Pod, PodRef
from tessera.cluster.fake import FakeCluster
from tessera.cluster.port import (
    ClusterError,
    ConfigMap,
    Conflict,
    EventType,
    EvictionBlocked,
    Listing,
    WatchEvent,
)
from tessera.cluster.reflector import Reflector
from tessera.cluster.retry import update_config_map_with_retry


async def test_eviction_blocked_by_a_budget_keeps_the_pod() -> None:
    fake = FakeCluster()
    fake.add_pod(Pod("default", "p", node_name="n"))
    fake.block_eviction(PodRef("default", "p"))
    with pytest.raises(EvictionBlocked):
        await fake.evict(PodRef("default", "p"))
    assert (await fake.get_pod(PodRef("default", "p"))).name == "p"
    fake.block_eviction(PodRef("default", "p"), blocked=False)
    await fake.evict(PodRef("default", "p"))
    assert fake.evictions == [PodRef("default", "p")]


async def test_fake_records_bindings_and_writes_the_annotation() -> None:
    fake = FakeCluster()
    fake.add_pod(Pod("default", "p"))
    assignment = DeviceAssignment("n", (GpuShare("GPU-1", 300),))
    await fake.bind(PodRef("default", "p"), "n", assignment)
    pod = await fake.get_pod(PodRef("default", "p"))
    assert fake.bindings == [(PodRef("default", "p"), "n")]
    assert pod.assignment == assignment
    assert '"milli":300' in pod.annotations[GPU_ASSIGNMENT_ANNOTATION]


async def test_resource_versions_increase_with_every_write() -> None:
    fake = FakeCluster()
    first = fake.add_node(Node("a", 1000, 1024))
    second = fake.add_node(Node("b", 1000, 1024))
    assert first.resource_version is not None and second.resource_version is not None
    assert int(second.resource_version) > int(first.resource_version)
    cordoned = await fake.cordon("a")
    assert cordoned.unschedulable and int(cordoned.resource_version or 0) > int(second.resource_version)


async def test_reflector_retries_after_a_failing_watch_without_relisting() -> None:
    attempts: list[str] = []
    node = Node("a", 1, 1)

    async def list_nodes() -> Listing[Node]:
        return Listing((node,), "5")

    async def watch(rv: str) -> AsyncIterator[WatchEvent[Node]]:
        attempts.append(rv)
        if len(attempts) == 1:
            raise ClusterError("connection reset")
        yield WatchEvent(EventType.MODIFIED, Node("a", 2, 2), "6")
        await asyncio.Event().wait()

    reflector: Reflector[Node] = Reflector("nodes", list_nodes, watch, key=lambda n: n.name, retry_delay=0.01)
    task = asyncio.create_task(reflector.run())
    try:
        await reflector.wait_for(lambda store: store.get("a") == Node("a", 2, 2), 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert attempts == ["5", "5"]
    assert reflector.lists == 1
    assert reflector.resource_version == "6"


async def test_config_map_retry_gives_up_after_repeated_conflicts() -> None:
    writes = 0

    async def read() -> ConfigMap:
        return ConfigMap("ns", "cm", {}, {}, "1")

    async def write(data: Mapping[str, str], current: ConfigMap | None) -> ConfigMap:
        nonlocal writes
        writes += 1
        raise Conflict("stale")

    with pytest.raises(Conflict, match="gave up after 3"):
        await update_config_map_with_retry(read, write, lambda current: {"k": "v"}, attempts=3)
    assert writes == 3


async def test_config_map_update_creates_a_missing_map() -> None:
    fake = FakeCluster()
    created = await fake.update_config_map("ns", "cm", lambda current: {**current, "a": "1"})
    assert created.data == {"a": "1"}
    assert (await fake.get_config_map("ns", "cm")) == created


async def test_reflector_survives_an_unexpected_failure_and_relists() -> None:
    attempts: list[str] = []

    async def list_nodes() -> Listing[Node]:
        return Listing((Node("a", 1, 1),), str(len(attempts) + 5))

    async def watch(rv: str) -> AsyncIterator[WatchEvent[Node]]:
        attempts.append(rv)
        if len(attempts) == 1:
            raise OverflowError("cannot convert Infinity to integer")  # a bug, not a cluster error
        yield WatchEvent(EventType.MODIFIED, Node("a", 2, 2), "9")
        await asyncio.Event().wait()

    reflector: Reflector[Node] = Reflector("nodes", list_nodes, watch, key=lambda n: n.name, retry_delay=0.01)
    task = asyncio.create_task(reflector.run())
    try:
        await reflector.wait_for(lambda store: store.get("a") == Node("a", 2, 2), 5)
        assert not task.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert reflector.lists == 2  # started over from a fresh list
    assert attempts == ["5", "6"]


async def test_a_watch_that_ends_at_once_without_events_is_not_reopened_in_a_hot_loop() -> None:
    opened = 0

    async def list_nodes() -> Listing[Node]:
        return Listing((), "5")

    async def watch(rv: str) -> AsyncIterator[WatchEvent[Node]]:
        nonlocal opened
        opened += 1
        return
        yield  # an async generator that ends at once

    reflector: Reflector[Node] = Reflector("nodes", list_nodes, watch, key=lambda n: n.name)
    task = asyncio.create_task(reflector.run())
    await asyncio.sleep(2.0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert reflector.lists == 1
    assert 3 <= opened <= 10, opened  # backing off to a second apart, not thousands a second
