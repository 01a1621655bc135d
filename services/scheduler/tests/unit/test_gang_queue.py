"""The gang queue: order, backoff, parking on requeue hints, flushing."""

from __future__ import annotations

import pytest

from tessera.scheduler.domain.framework.builders import make_gang
from tessera.scheduler.domain.framework.pod import InvalidSpec
from tessera.scheduler.domain.framework.status import Reason
from tessera.scheduler.domain.gang.queue import (
    ALL_EVENTS,
    BackoffPolicy,
    ClusterEvent,
    GangQueue,
    QueueOrder,
    RequeueReason,
    hints_for,
)
from tessera.scheduler.domain.gang.spec import GangSpec


def test_pop_order_is_priority_then_submit_time() -> None:
    queue = GangQueue()
    for name, priority, submitted in [("a", 0, 0.0), ("b", 9, 5.0), ("c", 9, 1.0), ("d", 1, 0.5)]:
        queue.add(make_gang(name, 1, priority=priority, submitted_at=submitted))
    order = []
    while (entry := queue.pop(now=0.0)) is not None:
        order.append(entry.name)
    assert order == ["c", "b", "d", "a"]


def test_backoff_doubles_per_failure_up_to_the_maximum() -> None:
    policy = BackoffPolicy(initial_s=1.0, max_s=10.0)
    assert [policy.delay(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    with pytest.raises(ValueError, match=r"backoff\.max_s"):
        BackoffPolicy(initial_s=5.0, max_s=1.0)


def test_a_timed_out_gang_waits_out_its_backoff_before_it_is_active_again() -> None:
    queue = GangQueue(BackoffPolicy(initial_s=2.0, max_s=60.0))
    queue.add(make_gang("g", 1))
    assert queue.pop(0.0) is not None
    queue.requeue("g", RequeueReason.PERMIT_TIMEOUT, now=10.0)
    assert queue.next_wakeup() == 12.0
    assert queue.pop(11.0) is None
    entry = queue.pop(12.0)
    assert entry is not None and entry.attempts == 1
    queue.requeue("g", RequeueReason.BIND_FAILED, now=12.0)
    assert queue.entry("g").backoff_until == 16.0


def test_a_parked_gang_wakes_only_on_a_hinted_event_or_after_the_flush_interval() -> None:
    queue = GangQueue(BackoffPolicy(initial_s=1.0, max_s=1.0), max_parked_s=300.0)
    queue.add(make_gang("g", 1))
    queue.pop(0.0)
    queue.requeue("g", RequeueReason.UNSCHEDULABLE, now=0.0, hints=hints_for([Reason.MODEL_NOT_ALLOWED]))
    assert queue.on_event(ClusterEvent.CAPACITY_FREED, now=5.0) == 0
    assert queue.pop(5.0) is None
    assert queue.on_event(ClusterEvent.NODE_ADDED, now=5.0) == 1
    assert queue.pop(5.0) is not None
    queue.requeue("g", RequeueReason.UNSCHEDULABLE, now=10.0, hints=frozenset())
    assert queue.pop(309.0) is None
    assert queue.pop(310.0) is not None


def test_a_woken_gang_still_in_backoff_waits_for_it() -> None:
    queue = GangQueue(BackoffPolicy(initial_s=8.0, max_s=8.0))
    queue.add(make_gang("g", 1))
    queue.pop(0.0)
    queue.requeue("g", RequeueReason.UNSCHEDULABLE, now=0.0, hints=ALL_EVENTS)
    queue.on_event(ClusterEvent.CAPACITY_FREED, now=1.0)
    assert queue.backing_off() == ("g",)
    assert queue.pop(7.0) is None
    assert queue.pop(8.0) is not None


@pytest.mark.parametrize(
    ("reasons", "wakes_on", "sleeps_through"),
    [
        ([Reason.INSUFFICIENT_GPU], ClusterEvent.CAPACITY_FREED, None),
        ([Reason.UNHEALTHY_GPU], ClusterEvent.NODE_CHANGED, ClusterEvent.CAPACITY_FREED),
        (
            ["no free MIG device of the profile 1g.10gb"],
            ClusterEvent.LAYOUT_CHANGED,
            ClusterEvent.NODE_CHANGED,
        ),
        (["a reason from a third-party plugin"], ClusterEvent.LAYOUT_CHANGED, None),
    ],
)
def test_requeue_hints_follow_the_rejection_reasons(
    reasons: list[str], wakes_on: ClusterEvent, sleeps_through: ClusterEvent | None
) -> None:
    hints = hints_for(reasons)
    assert wakes_on in hints
    if sleeps_through is not None:
        assert sleeps_through not in hints


def test_removed_gangs_are_never_popped() -> None:
    queue = GangQueue()
    queue.add(make_gang("a", 1))
    queue.add(make_gang("b", 1, submitted_at=1.0))
    queue.remove("a")
    entry = queue.pop(0.0)
    assert entry is not None and entry.name == "b"
    assert queue.pop(0.0) is None


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        ({"min_available": -1}, "min_available"),
        ({"timeout_s": 0.0}, "timeout_s"),
    ],
)
def test_bad_gang_specs_name_the_field(kwargs: dict[str, float], field_name: str) -> None:
    members = make_gang("g", 2).members
    with pytest.raises(InvalidSpec) as error:
        GangSpec("g", members, **kwargs)  # type: ignore[arg-type]
    assert error.value.field.endswith(field_name)


def test_a_member_of_another_gang_is_refused() -> None:
    with pytest.raises(InvalidSpec, match="members"):
        GangSpec("g", make_gang("other", 1).members)


@pytest.mark.parametrize(
    ("order", "expected"),
    [(QueueOrder.SUBMITTED, ["a", "b"]), (QueueOrder.LAST_QUEUED, ["b", "a"])],
)
def test_a_failed_gang_keeps_its_place_or_goes_behind_depending_on_the_order(
    order: QueueOrder, expected: list[str]
) -> None:
    queue = GangQueue(BackoffPolicy(initial_s=1.0, max_s=1.0), order=order)
    queue.add(make_gang("a", 1, submitted_at=0.0))
    queue.add(make_gang("b", 1, submitted_at=5.0))
    assert queue.pop(10.0) is not None  # "a" is tried first and fails
    queue.requeue("a", RequeueReason.PERMIT_TIMEOUT, now=10.0)
    popped = [entry.name for entry in iter(lambda: queue.pop(20.0), None)]
    assert popped == expected
