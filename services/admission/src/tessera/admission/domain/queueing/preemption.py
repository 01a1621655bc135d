"""Choosing victims: the fewest, lowest-priority workloads that lose the least work, whose removal
lets the preemptor fit.

Candidates are ordered as Kueue orders them (other queues first, then lower priority, then the
most recently admitted), except that a workload's work counts from its newest checkpoint when it
saved one since it was admitted: among equals the one that checkpointed last loses least and goes
first, and one that saved nothing yet counts from its admission. Without checkpoints this is
Kueue's order. They are removed one by one until the preemptor fits, then added back in
reverse order wherever the preemptor still fits without them. What remains is a set from which
no victim can be spared. Two attempts are made:
1. within nominal quota: lower-priority jobs of the same queue, and jobs of queues that borrow
   (reclaim, per `reclaim_within_cohort`);
2. while borrowing (only with `borrow_within_cohort`): strictly lower-priority jobs of borrowing
   queues at or under `max_priority_threshold`, plus the same-queue candidates.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    """Other queues first, lowest priority, least work lost (the newest checkpoint or, without one
    since its admission, the most recently admitted), then the most recently created, fewest pods."""
    return (
        candidate.queue == preemptor_queue,
        candidate.workload.priority,
        -candidate.work_since,
        -candidate.workload.created_at,
        candidate.workload.pod_count,
        candidate.name,
    )


def find_victims(
    tree: QuotaTree,
    queue: QueueSpec,
    preemptor: Workload,
    usage: dict[FlavorResource, int],
    admitted: Mapping[str, Mapping[str, AdmittedWorkload]],
) -> list[Target] | None:
    """The victims to evict so `preemptor` fits with `usage`, or None when no set will do.

    `admitted` holds the admitted workloads of the cohort tree, by queue."""
    needed = set(usage)
    policy = queue.preemption
    priority = preemptor.priority
    within = policy.within_queue is WithinQueuePolicy.LOWER_PRIORITY
    reclaim = policy.reclaim_within_cohort
    borrow = policy.borrow_within_cohort
    threshold = borrow.max_priority_threshold
    nominal: list[Target] = []
    while_borrowing: list[Target] = []
    for queue_name, members in admitted.items():
        own = queue_name == queue.name
        if own and not within:
            continue
        # Other queues are only reclaimed from while they borrow what the preemptor needs.
        if not own and not any(tree.is_borrowing(queue_name, fr) for fr in needed):
            continue
        for c in members.values():
            workload = c.workload
            if not workload.preemptible or c.being_preempted or needed.isdisjoint(c.usage):
                continue
            victim_priority = workload.priority
            if own:
                if victim_priority < priority:
                    target = Target(c, PreemptionReason.WITHIN_QUEUE_PRIORITY)
                    nominal.append(target)
                    while_borrowing.append(target)
                continue
            if reclaim is ReclaimPolicy.ANY or (
                reclaim is ReclaimPolicy.LOWER_PRIORITY and victim_priority < priority
            ):
                nominal.append(Target(c, PreemptionReason.RECLAIM_WITHIN_COHORT))
            if (
                borrow.enabled
                and victim_priority < priority
                and (threshold is None or victim_priority <= threshold)
            ):
                while_borrowing.append(Target(c, PreemptionReason.BORROW_WITHIN_COHORT))
    attempts = [(nominal, False)]
    if borrow.enabled:
        attempts.append((while_borrowing, True))
    for candidates, allow_borrowing in attempts:
        candidates.sort(key=lambda t: victim_order_key(queue.name, t.victim))
        targets = _minimal_set(tree, queue.name, usage, needed, candidates, allow_borrowing)
        if targets is not None:
            return targets
    return None


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
