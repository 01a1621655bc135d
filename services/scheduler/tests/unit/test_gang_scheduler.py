"""Gang semantics: all-or-nothing, quorum and timeout, bind failure rollback, node loss, locality."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

import pytest

from tessera.scheduler.domain.cache import PodState
from tessera.scheduler.domain.framework.builders import make_gang, make_node, with_members
from tessera.scheduler.domain.framework.pod import JobClass
from tessera.scheduler.domain.gang.assembly import Assembly, assemble
from tessera.scheduler.domain.gang.queue import BackoffPolicy, ClusterEvent, RequeueReason
from tessera.scheduler.domain.gang.scheduler import GangOutcome, OutcomeKind
from tessera.scheduler.domain.plugins.reserve import RecordingBinder
from tessera.scheduler.domain.snapshot import Allocation, NodeInfo

T = TypeVar("T")


def cluster(nodes: int, gpus: int = 8, racks: tuple[str, ...] = ()) -> list[NodeInfo]:
    built = []
    for i in range(nodes):
        builder = make_node(f"n{i}").gpus(gpus)
        if racks:
            builder = builder.rack(racks[i])
        built.append(builder.build())
    return built


def held_gpus(world: Assembly) -> int:
    return sum(node.gpu_milli_used for node in world.cache.snapshot().nodes.values()) // 1000


def occupy(world: Assembly, node: str, count: int) -> None:
    world.cache.assume(Allocation(f"busy-{node}", "other", node, tuple((i, 1000) for i in range(count))))


def test_a_gang_that_fits_is_bound_whole_and_leaves_the_queue() -> None:
    binder = RecordingBinder()
    world = assemble(cluster(2), binder)
    world.scheduler.submit(make_gang("job", 4, gpus=4))
    [outcome] = world.scheduler.run(now=0.0)
    assert outcome.kind is OutcomeKind.PLACED
    assert len(outcome.bound) == 4 == len(binder.bound)
    assert all(world.cache.pod_state(a.pod) is PodState.BOUND for a in outcome.bound)
    assert held_gpus(world) == 16
    assert "job" not in world.queue


@pytest.mark.parametrize(
    ("busy_per_node", "pods", "gpus", "message"),
    [
        # Total capacity is short: the gang-wide check rejects it before any member is tried.
        (1, 4, 4, "gang needs more GPUs than are free (16 > 14)"),
        # Enough GPUs in total but not in the right shape: two members reserve, the third fits nowhere.
        (2, 3, 4, "insufficient GPU on all 2 schedulable nodes (needs 4 idle GPUs, at most 2 on a node)"),
    ],
)
def test_a_gang_that_cannot_be_placed_holds_nothing(
    busy_per_node: int, pods: int, gpus: int, message: str
) -> None:
    binder = RecordingBinder()
    world = assemble(cluster(2), binder)
    for node in ("n0", "n1"):
        occupy(world, node, busy_per_node)
    world.scheduler.submit(make_gang("job", pods, gpus=gpus))
    [outcome] = world.scheduler.run(now=0.0)
    assert outcome.kind is OutcomeKind.UNSCHEDULABLE
    assert outcome.message == message
    assert outcome.pod is not None and outcome.pod.startswith("job-")
    assert held_gpus(world) == 2 * busy_per_node
    assert binder.bound == []
    assert world.registry.placed("job") == 0
    assert world.queue.parked() == ("job",)
    assert ClusterEvent.CAPACITY_FREED in world.queue.entry("job").hints


def test_a_parked_gang_comes_back_when_capacity_is_freed() -> None:
    world = assemble(cluster(1), RecordingBinder())
    world.scheduler.submit(make_gang("first", 2, gpus=4))
    world.scheduler.submit(make_gang("second", 1, gpus=8, submitted_at=1.0))
    outcomes = world.scheduler.run(now=0.0)
    assert [o.kind for o in outcomes] == [OutcomeKind.PLACED, OutcomeKind.UNSCHEDULABLE]
    assert world.scheduler.run(now=100.0) == []  # nothing changed: the gang stays parked
    world.scheduler.gang_finished("first", now=100.0)
    [outcome] = world.scheduler.run(now=100.0)
    assert (outcome.gang, outcome.kind) == ("second", OutcomeKind.PLACED)


def test_an_event_outside_the_hints_does_not_wake_a_gang() -> None:
    world = assemble([make_node("t4").gpus(8, model="T4").build()], RecordingBinder())
    world.scheduler.submit(make_gang("job", 1, gpus=1, models=["H100"]))
    [outcome] = world.scheduler.run(now=0.0)
    assert outcome.message == "model not allowed on 1 node"
    assert world.scheduler.notify(ClusterEvent.CAPACITY_FREED, now=10.0) == 0
    assert world.scheduler.notify(ClusterEvent.NODE_ADDED, now=10.0) == 1


def test_members_wait_for_quorum_and_all_are_released_on_timeout() -> None:
    binder = RecordingBinder()
    world = assemble(cluster(1), binder)
    world.scheduler.submit(make_gang("job", 2, gpus=2, min_available=3, timeout_s=30.0))
    [outcome] = world.scheduler.run(now=0.0)
    assert (outcome.kind, outcome.deadline) == (OutcomeKind.WAITING, 30.0)
    assert held_gpus(world) == 4 and binder.bound == []
    assert world.scheduler.next_wakeup() == 30.0
    assert world.scheduler.run(now=29.9) == []
    [expired] = world.scheduler.run(now=30.0)
    assert expired.kind is OutcomeKind.TIMED_OUT
    assert expired.reason is RequeueReason.PERMIT_TIMEOUT
    assert held_gpus(world) == 0
    assert world.cache.allocations() == ()
    assert world.registry.placed("job") == 0
    assert world.queue.backing_off() == ("job",)
    assert binder.bound == []


def test_a_waiting_gang_binds_together_when_its_last_member_arrives() -> None:
    binder = RecordingBinder()
    world = assemble(cluster(1), binder)
    spec = make_gang("job", 2, gpus=2, min_available=3, timeout_s=30.0)
    world.scheduler.submit(spec)
    assert world.scheduler.run(now=0.0)[0].kind is OutcomeKind.WAITING
    world.scheduler.submit(with_members(spec, 1, gpus=2))
    [outcome] = world.scheduler.run(now=10.0)
    assert outcome.kind is OutcomeKind.PLACED
    assert sorted(a.pod for a in outcome.bound) == ["job-0", "job-1", "job-2"]
    assert world.scheduler.waiting() == {}
    assert world.scheduler.run(now=31.0) == []  # no stale timeout fires later


@pytest.mark.parametrize("failing_bind", [1, 2, 3, 4])
def test_a_bind_failing_halfway_evicts_the_bound_and_releases_everything(failing_bind: int) -> None:
    binder = RecordingBinder(fail_on=frozenset({failing_bind}))
    world = assemble(cluster(2), binder, backoff=BackoffPolicy(initial_s=5.0, max_s=60.0))
    world.scheduler.submit(make_gang("job", 4, gpus=2))
    [outcome] = world.scheduler.run(now=0.0)
    assert outcome.kind is OutcomeKind.BIND_FAILED
    assert len(outcome.evicted) == failing_bind - 1
    assert [a.pod for a in binder.evicted] == [a.pod for a in binder.bound]
    assert held_gpus(world) == 0 and world.cache.allocations() == ()
    assert world.registry.placed("job") == 0 and world.registry.bound("job") == frozenset()
    entry = world.queue.entry("job")
    assert (entry.last_reason, entry.backoff_until) == (RequeueReason.BIND_FAILED, 5.0)
    # After its backoff the gang is tried again and, the API being back, placed whole.
    assert world.scheduler.run(now=4.0) == []
    [retry] = world.scheduler.run(now=5.0)
    assert retry.kind is OutcomeKind.PLACED and len(retry.bound) == 4
    assert held_gpus(world) == 8


def test_losing_a_node_evicts_the_rest_of_the_gang() -> None:
    binder = RecordingBinder()
    world = assemble(cluster(2), binder)
    world.scheduler.submit(make_gang("job", 2, gpus=8))
    [placed] = world.scheduler.run(now=0.0)
    assert placed.nodes == {"n0", "n1"}
    [broken] = world.scheduler.node_lost("n1", now=5.0)
    assert broken.kind is OutcomeKind.BROKEN and broken.reason is RequeueReason.NODE_LOST
    assert {a.node for a in broken.evicted} == {"n0", "n1"}
    assert world.cache.allocations() == ()
    assert world.queue.backing_off() == ("job",)


def test_quorum_below_the_member_count_binds_the_quorum_and_queues_the_rest() -> None:
    world = assemble(cluster(1), RecordingBinder())
    world.scheduler.submit(make_gang("job", 3, gpus=4, min_available=2))
    [outcome] = world.scheduler.run(now=0.0)
    assert outcome.kind is OutcomeKind.PLACED and len(outcome.bound) == 2
    assert world.queue.parked() == ("job",)
    world.cache.upsert_node(make_node("n9").gpus(8).build())
    world.scheduler.notify(ClusterEvent.NODE_ADDED, now=2.0)
    [rest] = world.scheduler.run(now=2.0)
    assert rest.kind is OutcomeKind.PLACED and [a.node for a in rest.bound] == ["n9"]
    assert "job" not in world.queue


def test_a_gang_prefers_fewer_nodes() -> None:
    world = assemble(cluster(4), RecordingBinder())
    world.scheduler.submit(make_gang("job", 4, gpus=2))
    [outcome] = world.scheduler.run(now=0.0)
    assert len(outcome.nodes) == 1


def test_a_gang_spilling_over_a_node_stays_in_its_rack() -> None:
    world = assemble(cluster(3, racks=("r1", "r2", "r1")), RecordingBinder())
    occupy(world, "n0", 4)
    world.scheduler.submit(make_gang("job", 3, gpus=4))
    [outcome] = world.scheduler.run(now=0.0)
    assert outcome.kind is OutcomeKind.PLACED
    assert outcome.nodes == {"n0", "n2"}


def test_without_gangs_pods_are_bound_one_by_one_and_may_hold_gpus_partially() -> None:
    binder = RecordingBinder()
    world = assemble(cluster(1), binder, gangs=False)
    for i in range(3):
        world.scheduler.submit(make_gang(f"job-{i}", 1, gpus=4))
    outcomes = world.scheduler.run(now=0.0)
    assert [o.kind for o in outcomes] == [OutcomeKind.PLACED, OutcomeKind.PLACED, OutcomeKind.UNSCHEDULABLE]
    assert held_gpus(world) == 8


def test_gangs_run_by_priority_then_submit_time() -> None:
    world = assemble(cluster(1, gpus=1), RecordingBinder())
    world.scheduler.submit(make_gang("old-low", 1, priority=0, submitted_at=0.0))
    world.scheduler.submit(make_gang("new-high", 1, priority=5, submitted_at=9.0))
    world.scheduler.submit(make_gang("old-high", 1, priority=5, submitted_at=1.0))
    outcomes = world.scheduler.run(now=10.0)
    assert [(o.gang, o.kind) for o in outcomes] == [
        ("old-high", OutcomeKind.PLACED),
        ("new-high", OutcomeKind.UNSCHEDULABLE),
        ("old-low", OutcomeKind.UNSCHEDULABLE),
    ]


def test_an_unhealthy_gpu_event_keeps_new_gangs_off_it() -> None:
    world = assemble(cluster(1, gpus=2), RecordingBinder())
    world.cache.set_gpu_health("n0", 0, healthy=False)
    world.scheduler.submit(make_gang("job", 2, gpus=1))
    [outcome] = world.scheduler.run(now=0.0)
    assert outcome.kind is OutcomeKind.UNSCHEDULABLE
    assert outcome.message == "gang needs more GPUs than are free (2 > 1)"
    world.cache.set_gpu_health("n0", 0, healthy=True)
    assert world.scheduler.notify(ClusterEvent.NODE_CHANGED, now=1.0) == 1
    assert world.scheduler.run(now=1.0)[0].kind is OutcomeKind.PLACED


def test_interleaved_pods_deadlock_without_gangs_and_not_with_them() -> None:
    """Two 2-pod jobs whose pods arrive interleaved on one 8-GPU node: the textbook gang deadlock."""
    pod_by_pod = assemble(cluster(1), RecordingBinder(), gangs=False)
    for at, name in enumerate(["a-0", "b-0", "a-1", "b-1"]):
        pod_by_pod.scheduler.submit(make_gang(name, 1, gpus=4, submitted_at=float(at)))
    kinds = [(o.gang, o.kind) for o in pod_by_pod.scheduler.run(now=10.0)]
    assert kinds[:2] == [("a-0", OutcomeKind.PLACED), ("b-0", OutcomeKind.PLACED)]
    assert {kind for _, kind in kinds[2:]} == {OutcomeKind.UNSCHEDULABLE}
    assert held_gpus(pod_by_pod) == 8  # every GPU held, and neither job can start

    gangs = assemble(cluster(1), RecordingBinder())
    gangs.scheduler.submit(make_gang("a", 2, gpus=4, submitted_at=0.0))
    gangs.scheduler.submit(make_gang("b", 2, gpus=4, submitted_at=1.0))
    outcomes = gangs.scheduler.run(now=10.0)
    assert [(o.gang, o.kind) for o in outcomes] == [
        ("a", OutcomeKind.PLACED),
        ("b", OutcomeKind.UNSCHEDULABLE),
    ]
    gangs.scheduler.gang_finished("a", now=20.0)
    assert gangs.scheduler.run(now=20.0)[0].kind is OutcomeKind.PLACED


@pytest.mark.parametrize(
    ("job_class", "nodes_used", "distinct_gpus"),
    [
        # High QoS: one replica per node.
        (JobClass.HIGH_QOS, 4, 4),
        # Small: all four quarter-GPU pods share one GPU of one node.
        (JobClass.SMALL, 1, 1),
        # Tightly coupled: one node, but each pod on its own GPU.
        (JobClass.TIGHTLY_COUPLED, 1, 4),
    ],
)
def test_job_classes_follow_the_hami_placement_practice(
    job_class: JobClass, nodes_used: int, distinct_gpus: int
) -> None:
    world = assemble(cluster(4), RecordingBinder())
    base = make_gang("job", 4, gpus=1, milli=250)
    spec = replace(base, members=tuple(pod.for_job_class(job_class) for pod in base.members))
    world.scheduler.submit(spec)
    [outcome] = world.scheduler.run(now=0.0)
    assert outcome.kind is OutcomeKind.PLACED
    assert len(outcome.nodes) == nodes_used
    assert len({(a.node, a.gpu_indices) for a in outcome.bound}) == distinct_gpus


def test_state_rebuilt_after_a_restart_keeps_placed_gangs_and_evicts_half_bound_ones() -> None:
    before = assemble(cluster(2), RecordingBinder())
    placed = make_gang("placed", 2, gpus=4)
    before.scheduler.submit(placed)
    before.scheduler.run(now=0.0)
    # "half" had two of its four members bound when the scheduler stopped.
    half = make_gang("half", 4, gpus=2)
    bound = list(before.cache.allocations(PodState.BOUND))
    bound += [Allocation(f"half-{i}", "half", "n1", ((i, 1000),)) for i in range(2)]

    binder = RecordingBinder()
    after = assemble(cluster(2), binder, bound=bound, gangs_known=[placed, half])
    assert held_gpus(after) == 10
    [outcome] = after.scheduler.recover(now=1.0)
    assert outcome.reason is RequeueReason.PARTIAL_AFTER_RESTART
    assert sorted(a.pod for a in binder.evicted) == ["half-0", "half-1"]
    assert held_gpus(after) == 8
    [retry] = after.scheduler.run(now=2.0)
    assert retry.kind is OutcomeKind.PLACED and len(retry.bound) == 4
    assert after.registry.quorum_met("placed") and "placed" not in after.queue


def test_watch_events_break_gangs_on_vanished_gpus_and_wake_parked_gangs() -> None:
    world = assemble(cluster(1), RecordingBinder())
    world.scheduler.submit(make_gang("job", 2, gpus=4))
    world.scheduler.run(now=0.0)
    # inventory_changed: the node now reports only four GPUs; the member on GPUs 4-7 is gone.
    [broken] = world.scheduler.node_changed(make_node("n0").gpus(4).build(), now=1.0)
    assert broken.reason is RequeueReason.NODE_LOST and len(broken.evicted) == 2
    assert world.cache.allocations() == ()
    world.scheduler.gang_finished("job", now=2.0)  # its job is withdrawn
    world.scheduler.submit(make_gang("big", 1, gpus=8))
    assert world.scheduler.run(now=100.0)[-1].kind is OutcomeKind.UNSCHEDULABLE
    world.scheduler.node_changed(make_node("n1").gpus(8).build(), now=101.0)
    [placed] = world.scheduler.run(now=200.0)
    assert (placed.gang, placed.kind, placed.nodes) == ("big", OutcomeKind.PLACED, frozenset({"n1"}))


def test_slice_inventory_wakes_a_gang_waiting_for_mig_devices() -> None:
    world = assemble([make_node("n0").gpus(0).build()], RecordingBinder())
    gang = make_gang("mig", 1, gpus=0, mig={"1g.10gb": 1})
    world.scheduler.submit(gang)
    [outcome] = world.scheduler.run(now=0.0)
    assert outcome.message == "no free MIG device of the profile 1g.10gb on 1 node"
    world.scheduler.slices_changed("n0", {"1g.10gb": 7}, now=5.0)
    assert world.scheduler.run(now=5.0)[0].kind is OutcomeKind.PLACED


def test_resubmitting_a_placed_gang_does_not_place_it_twice() -> None:
    world = assemble(cluster(1), RecordingBinder())
    spec = make_gang("job", 2, gpus=2)
    world.scheduler.submit(spec)
    assert world.scheduler.run(now=0.0)[0].kind is OutcomeKind.PLACED
    world.scheduler.submit(spec)
    assert world.scheduler.run(now=1.0) == []
    assert held_gpus(world) == 4


def test_a_placed_gang_says_why_each_member_went_where_it_did() -> None:
    world = assemble(cluster(3), RecordingBinder())
    occupy(world, "n0", 8)  # full: the GPU filter turns it away
    world.scheduler.submit(make_gang("job", 2, gpus=4))
    [outcome] = world.scheduler.run(now=0.0)
    assert outcome.kind is OutcomeKind.PLACED
    assert [d.pod for d in outcome.decisions] == [a.pod for a in outcome.bound]
    for decision in outcome.decisions:
        assert decision.node in outcome.nodes and decision.node != "n0"
        assert decision.nodes_considered == 3
        assert decision.feasible_nodes == 3 - sum(decision.rejected.values())
        assert decision.rejected.get("insufficient GPU", 0) >= 1
    assert outcome.decisions[0].score > 0  # two nodes fit the first member: they were scored


def test_each_attempt_runs_inside_the_wrapper_given() -> None:
    binder = RecordingBinder()
    world = assemble(cluster(1), binder)
    world.scheduler.submit(make_gang("fits", 1, gpus=4))
    world.scheduler.submit(make_gang("too-big", 1, gpus=16, submitted_at=1.0))
    steps: list[tuple[str, str]] = []

    def around(gang: str, step: Callable[[], T]) -> T:
        binds = len(binder.bound)
        result = step()
        kind = result.kind.value if isinstance(result, GangOutcome) else "step"
        steps.append((gang, "bound" if len(binder.bound) > binds else kind))
        return result

    outcomes = world.scheduler.run(now=0.0, around=around)
    # Decided in queue order; the gang that reached quorum is bound, then finished, in its own steps.
    assert steps == [
        ("fits", "step"),
        ("too-big", "unschedulable"),
        ("fits", "bound"),
        ("fits", "placed"),
    ]
    # Outcomes keep the order the gangs were tried in.
    assert [(o.gang, o.kind) for o in outcomes] == [
        ("fits", OutcomeKind.PLACED),
        ("too-big", OutcomeKind.UNSCHEDULABLE),
    ]
