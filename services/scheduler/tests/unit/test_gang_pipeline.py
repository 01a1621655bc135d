"""Binds in flight while the next gangs are decided: all-or-nothing and the decisions unchanged."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import pytest

from tessera.scheduler.domain.framework.builders import make_gang, make_node
from tessera.scheduler.domain.gang.assembly import Assembly, assemble
from tessera.scheduler.domain.gang.queue import BackoffPolicy, RequeueReason
from tessera.scheduler.domain.gang.scheduler import GangOutcome, OutcomeKind
from tessera.scheduler.domain.plugins.reserve import BindError, RecordingBinder
from tessera.scheduler.domain.snapshot import Allocation

T = TypeVar("T")


class ThreadedBinder(RecordingBinder):
    """Binds on threads of its own (the pipelined port); ``hold`` makes one pod's bind wait for
    ``release`` and then fail, so the test can decide other gangs while it is in flight."""

    def __init__(self, hold: str | None = None) -> None:
        super().__init__()
        self.hold = hold
        self.release = threading.Event()
        self.held = threading.Event()
        self.lock = threading.Lock()
        self._threads = ThreadPoolExecutor(max_workers=4)

    def start(self, call: Callable[[], T]) -> Future[T]:
        return self._threads.submit(call)

    def bind(self, allocation: Allocation) -> None:
        if allocation.pod == self.hold:
            self.held.set()
            assert self.release.wait(10), "the test never released the held bind"
            raise BindError(f"{allocation.pod}: refused while the next gang was decided")
        with self.lock:
            self.bound.append(allocation)

    def close(self) -> None:
        self._threads.shutdown(wait=True)


def world(binder: RecordingBinder, *, pipeline: bool = True, nodes: int = 2) -> Assembly:
    cluster = [make_node(f"n{i}").gpus(8).build() for i in range(nodes)]
    return assemble(cluster, binder, backoff=BackoffPolicy(initial_s=5.0, max_s=60.0), pipeline=pipeline)


def test_a_bind_failing_while_the_next_gang_is_decided_rolls_its_gang_back_whole() -> None:
    binder = ThreadedBinder(hold="first-1")
    placed = world(binder)
    placed.scheduler.submit(make_gang("first", 3, gpus=2))
    placed.scheduler.submit(make_gang("second", 2, gpus=2, submitted_at=1.0))
    decided: list[str] = []

    def around(gang: str, step: Callable[[], T]) -> T:
        result = step()
        ready = result is not None and not isinstance(result, GangOutcome)  # decided, to be bound
        if ready:
            decided.append(gang)
        if gang == "second" and ready:
            # "first" is still binding (its second member is held) while "second" has been decided.
            assert binder.held.wait(10) and not binder.release.is_set()
            binder.release.set()
        return result

    try:
        first, second = placed.scheduler.run(now=0.0, around=around)
    finally:
        binder.close()
    assert decided == ["first", "second"]
    # The first gang is rolled back exactly as when binding waited: its bound member evicted,
    # every reservation released, the gang in backoff.
    assert first.gang == "first" and first.kind is OutcomeKind.BIND_FAILED
    assert [a.pod for a in first.evicted] == ["first-0"] == [a.pod for a in binder.evicted]
    assert placed.registry.bound("first") == frozenset() and placed.registry.placed("first") == 0
    entry = placed.queue.entry("first")
    assert (entry.last_reason, entry.backoff_until) == (RequeueReason.BIND_FAILED, 5.0)
    # The second gang, decided while the first was binding, is placed whole; only it holds GPUs.
    assert second.gang == "second" and second.kind is OutcomeKind.PLACED and len(second.bound) == 2
    assert {a.pod for a in placed.cache.allocations()} == {"second-0", "second-1"}
    assert sum(n.gpu_milli_used for n in placed.cache.snapshot().nodes.values()) == 4000


def test_every_bind_is_finished_before_the_run_returns() -> None:
    binder = ThreadedBinder()
    placed = world(binder, nodes=4)
    for i in range(12):
        placed.scheduler.submit(make_gang(f"g{i}", 2, gpus=1, submitted_at=float(i)))
    try:
        outcomes = placed.scheduler.run(now=0.0)
    finally:
        binder.close()
    assert [o.gang for o in outcomes] == [f"g{i}" for i in range(12)]
    assert all(o.kind is OutcomeKind.PLACED and len(o.bound) == 2 for o in outcomes)
    assert placed.scheduler.waiting() == {} and all(f"g{i}" not in placed.queue for i in range(12))
    assert sorted(a.pod for a in binder.bound) == sorted(a.pod for a in placed.cache.allocations())


@pytest.mark.parametrize("gangs", [5, 30])
def test_pipelined_binds_decide_as_binding_in_batches_does(gangs: int) -> None:
    def placements(pipeline: bool) -> list[tuple[str, str, tuple[tuple[int, int], ...]]]:
        binder = ThreadedBinder()
        placed = world(binder, pipeline=pipeline, nodes=3)
        for i in range(gangs):
            placed.scheduler.submit(make_gang(f"g{i}", 1 + i % 3, gpus=1 + i % 2, submitted_at=float(i)))
        try:
            outcomes = placed.scheduler.run(now=0.0)
        finally:
            binder.close()
        return [(o.gang, a.node, a.gpu_milli) for o in outcomes for a in o.bound]

    assert placements(pipeline=True) == placements(pipeline=False)
