"""One admission cycle, written as named steps: sample fair share -> preemptors whose victims
are gone -> queue heads in order -> compact queues.

Every job that fits is admitted in the same cycle. Queue heads sit in one heap ordered by
(queues within their nominal quota before borrowers, fair share when enabled, priority,
creation time); after each admission only that queue's next head is pushed, with its key
recomputed (a queue's key depends on its own usage alone), so a cycle costs
O(examined x log queues).
Usage is accounted incrementally in the quota tree. In best-effort queues a request that
failed once in a cycle is not re-evaluated for identical jobs behind it (nothing frees quota
during this step), which keeps a cycle linear even when thousands of jobs cannot fit.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from tessera.admission.domain.queueing.decisions import (
    Admit,
    CycleResult,
    Decision,
    Preempt,
    Wait,
    WaitReason,
)
from tessera.admission.domain.queueing.explain import quota_shortfall
from tessera.admission.domain.queueing.flavors import FitMode, assign_flavors, fits
from tessera.admission.domain.queueing.model import (
    AdmittedWorkload,
    DrainingVictim,
    InFlightPreemption,
    QueueingStrategy,
    QueueSpec,
    Workload,
)
from tessera.admission.domain.queueing.preemption import find_victims
from tessera.admission.domain.queueing.resources import FlavorResource
from tessera.admission.domain.queueing.shape import ShapeOracle

if TYPE_CHECKING:
    from tessera.admission.domain.queueing.engine import QueueingEngine

Signature = tuple[object, ...]
_NO_SHAPE = "quota allows it but the free GPUs cannot hold the gang as shaped"
_Outcome = tuple[WaitReason, str] | None


class AdmissionCycle:
    def __init__(self, engine: QueueingEngine, now: float, oracle: ShapeOracle | None) -> None:
        self.engine = engine
        self.now = now
        self.oracle = oracle
        self.decisions: list[Decision] = []
        self.waits: dict[str, WaitReason] = {}
        self.handled: set[str] = set()
        self.touched_queues: set[str] = set()
        self.admitted = 0
        self.searches_left = {
            q: engine.config.timing.max_searches_per_queue_per_cycle for q in engine.config.queues
        }

    def run(self) -> CycleResult:
        self._sample_fair_share()
        self._finish_preemptions()
        self._admit_heads()
        self.engine.drop_admitted_from_queues(self.touched_queues)
        if self.engine.fair_share.enabled:
            self.engine.fair_share.remember(self.engine.usage_by_queue())
        return CycleResult(self.decisions, self.admitted, len(self.handled), self.waits)

    # ---- steps -----------------------------------------------------------------------------------

    def _sample_fair_share(self) -> None:
        if self.engine.fair_share.enabled:
            self.engine.fair_share.sample(self.now)

    def _finish_preemptions(self) -> None:
        """Admit preemptors whose victims are gone (or overdue), ahead of every queue head.
        Their quota has been reserved since preemption was requested."""
        engine = self.engine
        inflight = engine.inflight_preemptions()
        for name, record in sorted(inflight.items(), key=lambda kv: (kv[1].requested_at, kv[0])):
            workload = engine.workload(name)
            remaining = self._still_draining(record)
            # Victims that released (even if admitted again since) are no longer waited for.
            record.victims = remaining
            self.handled.add(name)
            if remaining and self.now < record.deadline:
                self._wait(workload, WaitReason.WAITING_FOR_VICTIMS, f"waiting for {', '.join(remaining)}")
                continue
            for victim_name in remaining:
                victim = engine.admitted(victim_name)
                draining = engine.draining(victim_name)
                engine.release(victim_name)
                self.decisions.append(
                    Preempt(
                        victim_name, victim.queue, draining.preemptor, draining.reason, 0.0, self.now, True
                    )
                )
            if self.oracle is not None:
                placement = self.oracle.try_place(workload, record.flavors)
                if placement is None:
                    engine.drop_reservation(name, workload.queue)
                    self._wait(workload, WaitReason.NO_FEASIBLE_PLACEMENT, self._no_shape(workload))
                    continue
                self.oracle.commit(placement)
            del inflight[name]
            borrows = any(engine.tree.is_borrowing(workload.queue, fr) for fr in record.usage)
            self._admit(workload, record.flavors, record.usage, borrows, reserved=True)

    def _still_draining(self, record: InFlightPreemption) -> tuple[str, ...]:
        """The record's victims still draining for it: admitted no later than it was requested, and
        asked to leave (by it or by the preemption it waits on) without having released yet. A
        victim that released and was admitted again is another admission, which this preemptor
        neither waits for nor forces out."""
        engine = self.engine
        return tuple(
            v
            for v in record.victims
            if engine.is_draining(v) and engine.admitted(v).admitted_at <= record.requested_at
        )

    def _admit_heads(self) -> None:
        engine = self.engine
        pending = engine.pending_entries()
        cursors = dict.fromkeys(pending, 0)
        heap: list[tuple[tuple[bool, float, int, float, int], str]] = []
        failed: dict[str, dict[Signature, tuple[WaitReason, str]]] = {q: {} for q in pending}

        def push_next(queue: str) -> None:
            entries = pending[queue]
            strict = engine.config.queues[queue].strategy is QueueingStrategy.STRICT_FIFO
            i = cursors[queue]
            while i < len(entries) and entries[i][1] in self.handled:
                if strict and entries[i][1] in self.waits:
                    # A preemptor still waiting for its victims heads this strict queue.
                    self._block_rest(queue, i + 1, entries[i][1])
                    cursors[queue] = len(entries)
                    return
                i += 1
            cursors[queue] = i
            if i < len(entries):
                (neg_priority, created_at, seq), _ = entries[i]
                key = (self._borrowing(queue), self._share(queue), neg_priority, created_at, seq)
                heapq.heappush(heap, (key, queue))

        for queue in pending:
            push_next(queue)
        while heap:
            _, queue = heapq.heappop(heap)
            name = pending[queue][cursors[queue]][1]
            cursors[queue] += 1
            workload = engine.workload(name)
            self.handled.add(name)
            spec = engine.config.queues[queue]
            signature = _signature(workload)
            known = failed[queue].get(signature)
            outcome = self._wait(workload, *known) if known else self._try(workload)
            if outcome is not None:
                if outcome[0] is not WaitReason.WAITING_FOR_VICTIMS:
                    failed[queue][signature] = outcome
                if spec.strategy is QueueingStrategy.STRICT_FIFO:
                    self._block_rest(queue, cursors[queue], name)
                    continue
            push_next(queue)

    # ---- one job ---------------------------------------------------------------------------------

    def _no_shape(self, workload: Workload) -> str:
        """The shape the cluster could never give the workload, or that its free GPUs cannot now."""
        assert self.oracle is not None
        return self.oracle.never_fits(workload) or _NO_SHAPE

    def _short(self, spec: QueueSpec, usage: dict[FlavorResource, int], then: str) -> str:
        """`queue q: needs 8 A100-80GB GPUs, 4 free in quota, borrowing limit reached; <then>`."""
        numbers = quota_shortfall(self.engine.tree, spec, usage, self.engine.config.flavor_specs)
        return f"{numbers}; {then}" if numbers else f"no unused quota; {then}"

    def _try(self, workload: Workload) -> _Outcome:
        """Admit the workload, or request preemption for it, or say why it waits."""
        engine = self.engine
        spec = engine.config.queues[workload.queue]
        spot = engine.config.spot_flavors
        specs = engine.config.flavor_specs
        assignment = assign_flavors(engine.tree, spec, workload, spot, (), specs)
        if assignment.mode is FitMode.FIT:
            if self.oracle is not None:
                placement = self.oracle.try_place(workload, assignment.flavors)
                if placement is None and spot.intersection(assignment.flavors):
                    # No spot node free for it: on-demand capacity, if its quota has room now.
                    fallback = assign_flavors(engine.tree, spec, workload, spot, spot, specs)
                    if fallback.mode is FitMode.FIT:
                        placement = self.oracle.try_place(workload, fallback.flavors)
                        if placement is not None:
                            assignment = fallback
                if placement is None:
                    return self._wait(workload, WaitReason.NO_FEASIBLE_PLACEMENT, self._no_shape(workload))
                self.oracle.commit(placement)
            self._admit(workload, assignment.flavors, assignment.usage, assignment.borrows, reserved=False)
            return None
        if assignment.mode is FitMode.NO_FIT:
            return self._wait(workload, WaitReason.NO_MATCHING_FLAVOR, assignment.message)
        with engine.projected(workload.queue):
            if fits(engine.tree, workload.queue, assignment.usage, allow_borrowing=True):
                # It fits once victims already on their way out have left: wait for them.
                draining = engine.draining_in_cohort(workload.queue, set(assignment.usage))
                if draining:
                    return self._reserve(workload, assignment.flavors, assignment.usage, draining, [])
            if self.searches_left[workload.queue] <= 0:
                return self._wait(
                    workload,
                    WaitReason.QUOTA_EXHAUSTED,
                    self._short(spec, assignment.usage, "preemption search deferred"),
                )
            targets = find_victims(
                engine.tree, spec, workload, assignment.usage, engine.cohort_admitted(workload.queue)
            )
        if not targets:
            self.searches_left[workload.queue] = 0
            return self._wait(
                workload,
                WaitReason.QUOTA_EXHAUSTED,
                self._short(spec, assignment.usage, "no preemptible victims"),
            )
        self.searches_left[workload.queue] -= 1
        timing = engine.config.timing
        graces = [
            timing.checkpoint_grace_s if t.victim.workload.checkpointable else timing.default_grace_s
            for t in targets
        ]
        # Every victim of one preemptor shares one deadline: the longest grace plus the timeout.
        deadline = self.now + max(graces) + timing.release_timeout_s
        for target, grace in zip(targets, graces, strict=True):
            victim = target.victim
            self.decisions.append(
                Preempt(victim.name, victim.queue, workload.name, target.reason, grace, deadline)
            )
        new_victims = [DrainingVictim(t.victim.name, workload.name, t.reason, deadline) for t in targets]
        return self._reserve(workload, assignment.flavors, assignment.usage, new_victims, new_victims)

    def _reserve(
        self,
        workload: Workload,
        flavors: tuple[str, ...],
        usage: dict[FlavorResource, int],
        waits_for: list[DrainingVictim],
        new_victims: list[DrainingVictim],
    ) -> _Outcome:
        record = InFlightPreemption(
            workload.name,
            tuple(d.victim for d in waits_for),
            self.now,
            max(d.deadline for d in waits_for),
            flavors,
            usage,
        )
        self.engine.reserve_for_preemptor(record, workload.queue, new_victims)
        verb = "preempting" if new_victims else "waiting for"
        return self._wait(
            workload, WaitReason.WAITING_FOR_VICTIMS, f"{verb} {', '.join(d.victim for d in waits_for)}"
        )

    def _admit(
        self,
        workload: Workload,
        flavors: tuple[str, ...],
        usage: dict[FlavorResource, int],
        borrows: bool,
        reserved: bool,
    ) -> None:
        self.engine.hold(AdmittedWorkload(workload, flavors, usage, self.now), reserved=reserved)
        self.touched_queues.add(workload.queue)
        self.admitted += 1
        self.decisions.append(Admit(workload.name, workload.queue, flavors, usage, borrows))

    def _wait(self, workload: Workload, reason: WaitReason, message: str) -> _Outcome:
        self.waits[workload.name] = reason
        if self.engine.note_wait(workload.name, reason, message):
            self.decisions.append(Wait(workload.name, workload.queue, reason, message))
        return reason, message

    def _block_rest(self, queue: str, start: int, head: str) -> None:
        entries = self.engine.pending_entries()[queue]
        for _, name in entries[start:]:
            if name in self.handled:
                continue
            self.handled.add(name)
            self._wait(self.engine.workload(name), WaitReason.BLOCKED_BY_HEAD, f"strict FIFO: behind {head}")

    def _borrowing(self, queue: str) -> bool:
        tree = self.engine.tree
        return any(tree.is_borrowing(queue, fr) for fr in self.engine.config.queues[queue].quotas)

    def _share(self, queue: str) -> float:
        engine = self.engine
        if not engine.fair_share.enabled:
            return 0.0
        return engine.fair_share.share(
            queue, engine.tree.queue_usage(queue), engine.tree.capacity_of_root(queue)
        )


def _signature(workload: Workload) -> Signature:
    return (
        workload.priority,
        tuple((g.count, tuple(sorted(g.requests.items())), g.flavors, g.node) for g in workload.pod_groups),
    )
