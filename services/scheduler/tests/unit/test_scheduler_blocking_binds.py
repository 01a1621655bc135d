"""A cluster that binds on the calling thread (the Kubernetes adapter) is bound through that, with
no hop to the event loop: the binding threads wait on the request alone."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tessera.cluster.domain.allocation import DeviceAssignment
from tessera.cluster.domain.requirements import Pod, PodRef
from tessera.cluster.fake import FakeCluster
from tessera.scheduler.adapters.kube import ClusterBinder
from tessera.scheduler.domain.plugins.reserve import BindError
from tessera.scheduler.domain.snapshot import Allocation

Call = tuple[PodRef, str, DeviceAssignment | None, float | None]


class BlockingCluster(FakeCluster):
    def __init__(self, answer: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self.calls: list[Call] = []
        self.answer = answer

    def blocking_binds(self) -> Callable[..., None]:
        return self.bind_blocking

    def bind_blocking(
        self,
        ref: PodRef,
        node: str,
        assignment: DeviceAssignment | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.calls.append((ref, node, assignment, timeout_s))
        self.answer()


def allocation() -> Allocation:
    return Allocation("default/p0", "g", "n1", ((0, 1000),), 1000, 1024)


def test_the_bind_runs_on_the_calling_thread_with_the_binders_timeout() -> None:
    loop = asyncio.new_event_loop()  # never run: a bind through it would wait its timeout out
    try:
        cluster = BlockingCluster()
        binder = ClusterBinder(cluster, loop, lambda node: {0: "GPU-a"}, timeout_s=0.5)

        binder.bind(allocation())
    finally:
        loop.close()

    [(ref, node, assignment, timeout_s)] = cluster.calls
    assert (ref, node, timeout_s) == (PodRef("default", "p0"), "n1", 0.5)
    assert assignment is not None and [s.gpu_uuid for s in assignment.shares] == ["GPU-a"]


async def test_no_answer_in_time_fails_the_bind_and_evicts_a_pod_it_bound() -> None:
    def late() -> None:  # the bind landed, its answer did not
        cluster.add_pod(Pod("default", "p0", node_name="n1"))
        raise TimeoutError("no answer")

    cluster = BlockingCluster(late)
    cluster.add_pod(Pod("default", "p0"))
    binder = ClusterBinder(cluster, asyncio.get_running_loop(), lambda node: {}, timeout_s=1)

    with pytest.raises(BindError, match="no answer"):
        await asyncio.to_thread(binder.bind, allocation())
    await binder.settle()

    assert cluster.evictions == [PodRef("default", "p0")]


async def test_not_on_the_event_loop() -> None:
    cluster = BlockingCluster()
    binder = ClusterBinder(cluster, asyncio.get_running_loop(), lambda node: {}, timeout_s=1)

    with pytest.raises(BindError, match="event loop"):
        binder.bind(allocation())
    assert cluster.calls == []
