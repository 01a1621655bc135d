"""Choosing victims: the fewest, lowest-priority, most recently admitted workloads whose removal
lets the preemptor fit.

Candidates are ordered as Kueue orders them (other queues first, then lower priority, then the
most recently admitted), removed one by one until the preemptor fits, then added back in
reverse order wherever the preemptor still fits without them. What remains is a set from which
no victim can be spared. Two attempts are made:
1. within nominal quota: lower-priority jobs of the same queue, and jobs of queues that borrow
   (reclaim, per `reclaim_within_cohort`);
2. while borrowing (only with `borrow_within_cohort`): strictly lower-priority jobs of borrowing
   queues at or under `max_priority_threshold`, plus the same-queue candidates.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tessera.admission.domain.queueing.decisions import PreemptionReason
from tessera.admission.domain.queueing.flavors import fits
from tessera.admission.domain.queueing.model import (
    AdmittedWorkload,
    QueueSpec,
    ReclaimPolicy,
    WithinQueuePolicy,
    Workload,
)
from tessera.admission.domain.queueing.quota import QuotaTree
from tessera.admission.domain.queueing.resources import FlavorResource


@dataclass(frozen=True, slots=True)
class Target:
    victim: AdmittedWorkload
    reason: PreemptionReason


def victim_order_key(
    preemptor_queue: str, candidate: AdmittedWorkload
) -> tuple[bool, int, float, float, int, str]:
    """Other queues first, lowest priority, most recently admitted (then created), fewest pods."""
    return (
        candidate.queue == preemptor_queue,
        candidate.workload.priority,
        -candidate.admitted_at,
        -candidate.workload.created_at,
        candidate.workload.pod_count,
        candidate.name,
    )


def find_victims(
    tree: QuotaTree,
    queue: QueueSpec,
    preemptor: Workload,
    usage: dict[FlavorResource, int],
    admitted: Iterable[AdmittedWorkload],
) -> list[Target] | None:
    """The victims to evict so `preemptor` fits with `usage`, or None when no set will do."""
    needed = set(usage)
    overlapping = [
        c
        for c in admitted
        if c.workload.preemptible and not c.being_preempted and not needed.isdisjoint(c.usage)
    ]
    overlapping.sort(key=lambda c: victim_order_key(queue.name, c))
    policy = queue.preemption
    priority = preemptor.priority

    same_queue = [
        Target(c, PreemptionReason.WITHIN_QUEUE_PRIORITY)
        for c in overlapping
        if c.queue == queue.name
        and policy.within_queue is WithinQueuePolicy.LOWER_PRIORITY
        and c.workload.priority < priority
    ]
    reclaim = [
        Target(c, PreemptionReason.RECLAIM_WITHIN_COHORT)
        for c in overlapping
        if c.queue != queue.name
        and (
            policy.reclaim_within_cohort is ReclaimPolicy.ANY
            or (
                policy.reclaim_within_cohort is ReclaimPolicy.LOWER_PRIORITY
                and c.workload.priority < priority
            )
        )
    ]
    attempts: list[tuple[list[Target], bool]] = [(_merge(queue.name, reclaim, same_queue), False)]
    borrow = policy.borrow_within_cohort
    if borrow.enabled:
        threshold = borrow.max_priority_threshold
        borrowers = [
            Target(c, PreemptionReason.BORROW_WITHIN_COHORT)
            for c in overlapping
            if c.queue != queue.name
            and c.workload.priority < priority
            and (threshold is None or c.workload.priority <= threshold)
        ]
        attempts.append((_merge(queue.name, borrowers, same_queue), True))
    for candidates, allow_borrowing in attempts:
        targets = _minimal_set(tree, queue.name, usage, needed, candidates, allow_borrowing)
        if targets is not None:
            return targets
    return None


def _merge(queue: str, others: list[Target], same: list[Target]) -> list[Target]:
    merged = others + same
    merged.sort(key=lambda t: victim_order_key(queue, t.victim))
    return merged


def _minimal_set(
    tree: QuotaTree,
    queue: str,
    usage: dict[FlavorResource, int],
    needed: set[FlavorResource],
    candidates: list[Target],
    allow_borrowing: bool,
) -> list[Target] | None:
    if not candidates:
        return None
    targets: list[Target] = []
    found = False
    try:
        for target in candidates:
            victim = target.victim
            # A queue is only reclaimed from while it still borrows what the preemptor needs.
            if victim.queue != queue and not any(
                tree.is_borrowing(victim.queue, fr) for fr in needed if fr in victim.usage
            ):
                continue
            tree.remove_usage(victim.queue, victim.usage)
            targets.append(target)
            if fits(tree, queue, usage, allow_borrowing):
                found = True
                break
        if not found:
            return None
        # Give back, newest removal first, every victim the preemptor can do without.
        for i in range(len(targets) - 2, -1, -1):
            victim = targets[i].victim
            tree.add_usage(victim.queue, victim.usage)
            if fits(tree, queue, usage, allow_borrowing):
                targets.pop(i)
            else:
                tree.remove_usage(victim.queue, victim.usage)
        return targets
    finally:
        for target in targets:
            tree.add_usage(target.victim.queue, target.victim.usage)
