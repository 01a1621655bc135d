"""The cache: assume, confirm, forget; cluster events; snapshots; rebuild after a restart."""

from __future__ import annotations

import pytest

from tessera.scheduler.domain.cache import CacheConflict, PodState, SchedulerCache
from tessera.scheduler.domain.framework.builders import make_node
from tessera.scheduler.domain.snapshot import Allocation, Snapshot


def alloc(
    pod: str, node: str = "n1", gpus: tuple[int, ...] = (0,), milli: int = 1000, gang: str = "g"
) -> Allocation:
    return Allocation(pod, gang, node, tuple((i, milli) for i in gpus))


def cache_with(*names: str) -> SchedulerCache:
    return SchedulerCache.rebuild(make_node(name).gpus(4).build() for name in names)


def test_an_assumed_pod_is_in_the_next_snapshot_and_the_old_snapshot_is_unchanged() -> None:
    cache = cache_with("n1")
    before = cache.snapshot()
    cache.assume(alloc("p", gpus=(0, 1)))
    after = cache.snapshot()
    assert before.node("n1").free_whole_gpus == 4
    assert after.node("n1").free_whole_gpus == 2
    assert after.node("n1").gang_members == {"g": 1}
    assert after.generation > before.generation
    assert cache.pod_state("p") is PodState.ASSUMED


def test_snapshot_is_reused_until_the_cache_changes() -> None:
    cache = cache_with("n1")
    assert cache.snapshot() is cache.snapshot()


def test_forget_rolls_back_an_assumption_and_is_idempotent() -> None:
    cache = cache_with("n1")
    cache.assume(alloc("p"))
    assert cache.forget("p") is not None
    assert cache.forget("p") is None
    assert cache.snapshot().node("n1").gpu_milli_used == 0


def test_forget_leaves_a_bound_pod_alone() -> None:
    cache = cache_with("n1")
    cache.assume(alloc("p"))
    cache.confirm_bound("p")
    assert cache.forget("p") is None
    assert cache.pod_state("p") is PodState.BOUND
    assert cache.remove_pod("p") is not None
    assert cache.allocations() == ()


@pytest.mark.parametrize(
    ("allocation", "message"),
    [
        (alloc("q", node="nowhere"), "unknown to the cache"),
        (alloc("q", gpus=(9,)), "no GPU index 9"),
        (alloc("q", gpus=(0,), milli=600), "would pass 1000 milli"),
        (alloc("p"), "already placed"),
        (Allocation("q", "g", "n1", mig=(("1g.10gb", 1),)), "lacks 1 free MIG 1g.10gb"),
    ],
)
def test_an_impossible_assumption_is_refused(allocation: Allocation, message: str) -> None:
    cache = cache_with("n1")
    cache.assume(alloc("p", gpus=(0,), milli=500))
    with pytest.raises(CacheConflict, match=message):
        cache.assume(allocation)


def test_node_events_keep_the_allocations_on_the_node() -> None:
    cache = cache_with("n1")
    cache.assume(alloc("p", gpus=(1,)))
    cache.set_gpu_health("n1", 1, healthy=False)
    cache.set_schedulable("n1", False)
    cache.set_mig_capacity("n1", {"1g.10gb": 7})
    node = cache.snapshot().node("n1")
    assert node.gpus[1].milli_used == 1000 and not node.gpus[1].healthy
    assert not node.schedulable
    assert node.mig_free("1g.10gb") == 7
    cache.upsert_node(make_node("n1").gpus(8).build())
    assert cache.snapshot().node("n1").gpu_count == 8
    assert cache.snapshot().node("n1").gpu_milli_used == 1000


def test_removing_a_node_returns_what_was_lost() -> None:
    cache = cache_with("n1", "n2")
    cache.assume(alloc("a", node="n1"))
    cache.assume(alloc("b", node="n2"))
    assert [a.pod for a in cache.remove_node("n2")] == ["b"]
    assert list(cache.snapshot().nodes) == ["n1"]
    assert cache.remove_node("n2") == ()


def test_rebuild_from_nodes_and_bound_placements_gives_the_same_snapshot() -> None:
    nodes = [make_node("n1").gpus(4).build(), make_node("n2").gpus(4).build()]
    live = SchedulerCache.rebuild(nodes)
    for allocation in (
        alloc("a", gpus=(0, 1)),
        alloc("b", node="n2", milli=300),
        alloc("c", node="n2", milli=200),
    ):
        live.assume(allocation)
        live.confirm_bound(allocation.pod)
    restored = SchedulerCache.rebuild(nodes, live.allocations(PodState.BOUND))
    assert restored.snapshot().nodes == live.snapshot().nodes


def test_upsert_refuses_a_node_carrying_usage() -> None:
    used = make_node("n1").gpus(2).build().with_allocation(alloc("p"))
    with pytest.raises(CacheConflict, match="capacity only"):
        SchedulerCache().upsert_node(used)


def test_snapshot_totals_count_healthy_free_gpus_on_schedulable_nodes() -> None:
    snapshot = Snapshot.of(
        [
            make_node("a").gpus(8).unhealthy(0).build(),
            make_node("b").gpus(4).build(),
            make_node("c").gpus(8).cordoned().build(),
        ]
    )
    assert snapshot.totals.free_whole_gpus == 11
    assert snapshot.totals.max_free_whole_gpus_on_a_node == 7
    with pytest.raises(ValueError, match="duplicate"):
        Snapshot.of([make_node("a").gpus(1).build(), make_node("a").gpus(1).build()])
