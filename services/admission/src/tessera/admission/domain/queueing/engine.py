"""The queueing engine: the in-memory, pure state of admission (Kueue's cache and queue manager
together) and the entry point of the admission cycle.

The service feeds it (submit, release, cancel) from its store and event consumers, calls
`run_cycle`, then persists the decisions. Admission is assumed at once, Kueue style: an
admitted workload holds quota from the moment it is decided; if persisting fails the service
calls `unadmit` to give the quota back and requeue the job.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from tessera.admission.domain.queueing.config import QueueingConfig
from tessera.admission.domain.queueing.cycle import AdmissionCycle
from tessera.admission.domain.queueing.decisions import CycleResult, WaitReason
from tessera.admission.domain.queueing.errors import QueueingValidationError, UnknownWorkload
from tessera.admission.domain.queueing.fair_share import FairShareTracker
from tessera.admission.domain.queueing.model import (
    AdmittedWorkload,
    DrainingVictim,
    InFlightPreemption,
    Workload,
)
from tessera.admission.domain.queueing.quota import QuotaTree
from tessera.admission.domain.queueing.resources import FlavorResource, add_into
from tessera.admission.domain.queueing.shape import ShapeOracle
from tessera.admission.domain.queueing.validation import validate_workload

PendingKey = tuple[int, float, int]
"""(-priority, created_at, arrival sequence): the order within a queue."""


class QueueingEngine:
    def __init__(self, config: QueueingConfig) -> None:
        self.config = config
        self.tree = QuotaTree(config)
        self.fair_share = FairShareTracker(
            config.fair_sharing, {n: q.fair_share_weight for n, q in config.queues.items()}
        )
        self._seq = 0
        self._pending: dict[str, list[tuple[PendingKey, str]]] = {q: [] for q in config.queues}
        self._workloads: dict[str, Workload] = {}
        self._admitted: dict[str, AdmittedWorkload] = {}
        # cohort root -> queue -> job -> admitted, so preemption looks only where it may.
        self._admitted_by_root: dict[str, dict[str, dict[str, AdmittedWorkload]]] = {}
        self._inflight: dict[str, InFlightPreemption] = {}
        self._draining: dict[str, DrainingVictim] = {}
        # cohort root -> queue -> what its draining victims still hold (for the projected view)
        self._draining_usage: dict[str, dict[str, dict[FlavorResource, int]]] = {}
        self._last_wait: dict[str, tuple[WaitReason, str]] = {}

    # ---- feeding the engine ----------------------------------------------------------------------

    def validate(self, workload: Workload) -> None:
        validate_workload(self.config, self.tree, workload)

    def submit(self, workload: Workload) -> None:
        """Queue a workload; raises `QueueingValidationError` naming the field when it is bad."""
        if workload.name in self._workloads or workload.name in self._admitted:
            raise QueueingValidationError("name", f"job {workload.name!r} is already known")
        self.validate(workload)
        self._seq += 1
        key: PendingKey = (-workload.priority, workload.created_at, self._seq)
        bisect.insort(self._pending[workload.queue], (key, workload.name))
        self._workloads[workload.name] = workload

    def restore_admitted(
        self,
        workload: Workload,
        flavors: tuple[str, ...],
        admitted_at: float,
        checkpointed_at: float | None = None,
    ) -> None:
        """Rebuild state after a restart: the workload already holds quota in `flavors` (and saved its
        newest checkpoint at `checkpointed_at`, which preemption weighs)."""
        if workload.queue not in self.config.queues:
            raise QueueingValidationError("queue", f"unknown queue {workload.queue!r}")
        if len(flavors) != len(workload.pod_groups):
            raise QueueingValidationError(
                "flavors", f"one flavor per pod group: got {len(flavors)} for {len(workload.pod_groups)}"
            )
        unknown = sorted(set(flavors) - self.config.flavors)
        if unknown:
            raise QueueingValidationError("flavors", f"unknown flavor {unknown[0]!r}")
        usage: dict[tuple[str, str], int] = {}
        for group, flavor in zip(workload.pod_groups, flavors, strict=True):
            for res, qty in group.total_requests.items():
                usage[(flavor, res)] = usage.get((flavor, res), 0) + qty
        self.hold(AdmittedWorkload(workload, flavors, usage, admitted_at, checkpointed_at=checkpointed_at))

    def restore_preemption(self, record: InFlightPreemption, asked: Mapping[str, DrainingVictim]) -> None:
        """Rebuild an in-flight preemption after a restart, once its preemptor is queued again and
        every job that holds quota is restored. `asked` holds every victim asked to leave, with the
        request it drains for.

        Of the record's victims, those still admitted since before the request and asked to leave
        drain again, whoever asked them: a preemptor cancelled since may have asked for one this one
        waits for too. The others have left and drop out of the record. Raises
        `QueueingValidationError` when the record no longer fits the queued preemptor or the
        configuration (the service drops it, and the preemptor searches again)."""
        name = record.preemptor
        workload = self._workloads.get(name)
        if workload is None:
            raise QueueingValidationError("preemptor", f"job {name!r} is not queued")
        if name in self._inflight:
            raise QueueingValidationError("preemptor", f"job {name!r} is already waiting for victims")
        if len(record.flavors) != len(workload.pod_groups):
            raise QueueingValidationError(
                "flavors",
                f"one flavor per pod group: got {len(record.flavors)} for {len(workload.pod_groups)}",
            )
        unknown = sorted((set(record.flavors) | {f for f, _ in record.usage}) - self.config.flavors)
        if unknown:
            raise QueueingValidationError("flavors", f"unknown flavor {unknown[0]!r}")
        waits_for = [
            asked[v]
            for v in record.victims
            if v in asked and v in self._admitted and self._admitted[v].admitted_at <= record.requested_at
        ]
        new_victims = [d for d in waits_for if d.victim not in self._draining]
        record = dataclasses.replace(record, victims=tuple(d.victim for d in waits_for))
        self.reserve_for_preemptor(record, workload.queue, new_victims)

    def release(self, name: str) -> None:
        """An admitted job finished, failed, was cancelled or evicted: its quota is free again."""
        admitted = self._admitted.pop(name, None)
        if admitted is None:
            raise UnknownWorkload(name)
        self.tree.remove_usage(admitted.queue, admitted.usage)
        if self._draining.pop(name, None) is not None:
            held = self._draining_usage[self.tree.root_of(admitted.queue)][admitted.queue]
            add_into(held, admitted.usage, sign=-1)
        del self._admitted_by_root[self.tree.root_of(admitted.queue)][admitted.queue][name]

    def cancel(self, name: str) -> None:
        """Drop a queued job (or release an admitted one)."""
        if name in self._admitted:
            self.release(name)
            return
        workload = self._workloads.pop(name, None)
        if workload is None:
            raise UnknownWorkload(name)
        self._pending[workload.queue] = [e for e in self._pending[workload.queue] if e[1] != name]
        record = self._inflight.pop(name, None)
        if record is not None:
            self.tree.remove_usage(workload.queue, record.usage)
            # Its victims that no other preemptor waits for are no longer leaving: they keep their
            # quota, as the engine rebuilt from the stored records would find them.
            waited_for = {v for r in self._inflight.values() for v in r.victims}
            for victim in record.victims:
                if victim in self._draining and victim not in waited_for:
                    self._undrain(victim)
        self._last_wait.pop(name, None)

    def unadmit(self, name: str) -> None:
        """Roll back an admission the service could not persist; the job queues again."""
        admitted = self._admitted.get(name)
        if admitted is None:
            raise UnknownWorkload(name)
        self.release(name)
        self.submit(admitted.workload)

    # ---- reading ---------------------------------------------------------------------------------

    def is_admitted(self, name: str) -> bool:
        return name in self._admitted

    def is_pending(self, name: str) -> bool:
        return name in self._workloads

    def is_draining(self, name: str) -> bool:
        """Whether the admitted job has been asked to leave and has not released its quota yet."""
        return name in self._draining

    def admitted(self, name: str) -> AdmittedWorkload:
        return self._admitted[name]

    def admitted_in_queue(self, queue: str) -> list[AdmittedWorkload]:
        return [a for a in self._admitted.values() if a.queue == queue]

    def wait_reason(self, name: str) -> WaitReason | None:
        last = self._last_wait.get(name)
        return last[0] if last else None

    def inflight(self, preemptor: str) -> InFlightPreemption | None:
        return self._inflight.get(preemptor)

    def pending_count(self) -> int:
        return len(self._workloads)

    def queue_usage(self, queue: str) -> Mapping[tuple[str, str], int]:
        return self.tree.queue_usage(queue)

    # ---- the cycle -------------------------------------------------------------------------------

    def run_cycle(self, now: float, oracle: ShapeOracle | None = None) -> CycleResult:
        """Admit every queued job that fits, request preemptions, and report who waits and why."""
        return AdmissionCycle(self, now, oracle).run()

    # ---- used by the cycle -------------------------------------------------------------------------

    def hold(self, admitted: AdmittedWorkload, reserved: bool = False) -> None:
        """Record an admission; `reserved` when its usage is already in the tree."""
        name = admitted.name
        self._workloads.pop(name, None)
        self._last_wait.pop(name, None)
        self._admitted[name] = admitted
        by_queue = self._admitted_by_root.setdefault(self.tree.root_of(admitted.queue), {})
        by_queue.setdefault(admitted.queue, {})[name] = admitted
        if not reserved:
            self.tree.add_usage(admitted.queue, admitted.usage)

    def reserve_for_preemptor(
        self, record: InFlightPreemption, queue: str, new_victims: list[DrainingVictim]
    ) -> None:
        """Hold quota for a preemptor from now on, on top of its victims' until they leave: the
        room they free cannot go to anyone else, and nothing is admitted before it is free."""
        for draining in new_victims:
            victim = self._admitted[draining.victim]
            victim.being_preempted = True
            self._draining[draining.victim] = draining
            by_queue = self._draining_usage.setdefault(self.tree.root_of(victim.queue), {})
            add_into(by_queue.setdefault(victim.queue, {}), victim.usage)
        self.tree.add_usage(queue, record.usage)
        self._inflight[record.preemptor] = record

    def drop_reservation(self, preemptor: str, queue: str) -> None:
        record = self._inflight.pop(preemptor)
        self.tree.remove_usage(queue, record.usage)

    def draining(self, victim: str) -> DrainingVictim:
        return self._draining[victim]

    def _undrain(self, victim: str) -> None:
        """The victim is no longer asked to leave: it holds its quota as any admitted job."""
        del self._draining[victim]
        admitted = self._admitted[victim]
        admitted.being_preempted = False
        held = self._draining_usage[self.tree.root_of(admitted.queue)][admitted.queue]
        add_into(held, admitted.usage, sign=-1)

    def draining_in_cohort(self, queue: str, needed: set[FlavorResource]) -> list[DrainingVictim]:
        root = self.tree.root_of(queue)
        if not self._draining_usage.get(root):
            return []
        return [
            d
            for d in self._draining.values()
            if self.tree.root_of(self._admitted[d.victim].queue) == root
            and not needed.isdisjoint(self._admitted[d.victim].usage)
        ]

    @contextmanager
    def projected(self, queue: str) -> Iterator[None]:
        """`queue`'s cohort tree as it will be once every draining victim has left: preemption
        decides on this view, so two preemptors never count on the same victims."""
        held = self._draining_usage.get(self.tree.root_of(queue), {})
        for victim_queue, usage in held.items():
            self.tree.remove_usage(victim_queue, usage)
        try:
            yield
        finally:
            for victim_queue, usage in held.items():
                self.tree.add_usage(victim_queue, usage)

    def cohort_admitted(self, queue: str) -> Mapping[str, Mapping[str, AdmittedWorkload]]:
        """Admitted workloads of every queue in `queue`'s cohort tree, by queue."""
        return self._admitted_by_root.get(self.tree.root_of(queue), {})

    def pending_entries(self) -> dict[str, list[tuple[PendingKey, str]]]:
        return self._pending

    def workload(self, name: str) -> Workload:
        return self._workloads[name]

    def inflight_preemptions(self) -> dict[str, InFlightPreemption]:
        return self._inflight

    def note_wait(self, name: str, reason: WaitReason, message: str) -> bool:
        """Remember why a job waits; True when that changed since the last cycle."""
        previous = self._last_wait.get(name)
        self._last_wait[name] = (reason, message)
        return previous != (reason, message)

    def drop_admitted_from_queues(self, queues: Iterable[str]) -> None:
        for queue in queues:
            self._pending[queue] = [e for e in self._pending[queue] if e[1] in self._workloads]

    def usage_by_queue(self) -> dict[str, Mapping[tuple[str, str], int]]:
        return {q: self.tree.queue_usage(q) for q in self.config.queues}
