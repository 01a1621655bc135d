"""The scheduler's message handlers: record what arrived, then wake the scheduling loop after commit.

Decisions are never taken in a handler: the loop takes them one cycle at a time under the
scheduler's lock, so a redelivered or batched message only ever queues a gang once.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from tessera.contracts.base import Message
from tessera.contracts.events import (
    GpuUnhealthy,
    InventoryChanged,
    JobAdmitted,
    JobFinished,
    PreemptionRequested,
    ReadyForEviction,
)
from tessera.core.messaging.consumer import Handler, PermanentError
from tessera.core.messaging.envelope import Envelope, EnvelopeError
from tessera.core.observability.tracing import current_trace_headers
from tessera.scheduler.service_layer.unit_of_work import SchedulerUnitOfWork

M = TypeVar("M", bound=Message)


class SchedulingLoop(Protocol):
    """What the handlers tell the scheduling loop (the `SchedulingEngine`), always after commit."""

    def wake(self) -> None:
        """Run a cycle soon: something it reads has changed."""
        ...

    def gpu_unhealthy(self, node: str, index: int) -> None:
        """Place nothing more on this GPU (and run a cycle soon)."""
        ...


def parse_as(envelope: Envelope, kind: type[M]) -> M:
    """The body as ``kind``; another type or a body that fails its schema can never be handled."""
    try:
        message = envelope.parse()
    except EnvelopeError as exc:
        raise PermanentError(str(exc)) from exc
    if not isinstance(message, kind):
        raise PermanentError(f"expected {kind.TYPE}, got {envelope.type}")
    return message


def job_admitted_handler(loop: SchedulingLoop) -> Handler[SchedulerUnitOfWork]:
    """Queue the admitted job's gang once: a repeat, or a job already placed, changes nothing. A job
    that resumes keeps the checkpoint it resumes from with its gang, for its pods."""

    async def handle_job_admitted(envelope: Envelope, uow: SchedulerUnitOfWork) -> None:
        event = parse_as(envelope, JobAdmitted)
        if await uow.repo.is_placed(event.job_id):
            return
        if await uow.repo.add_pending(
            event.job_id,
            event.spec,
            event.submitted_at,
            trace=current_trace_headers(),
            resume_from=event.resume_from,
        ):
            uow.after_commit(loop.wake)

    return handle_job_admitted


def inventory_changed_handler(loop: SchedulingLoop) -> Handler[SchedulerUnitOfWork]:
    """The reporting source's nodes become the ones reported (inventory mode places on them)."""

    async def handle_inventory_changed(envelope: Envelope, uow: SchedulerUnitOfWork) -> None:
        event = parse_as(envelope, InventoryChanged)
        await uow.repo.replace_inventory(event.source, event.nodes)
        uow.after_commit(loop.wake)

    return handle_inventory_changed


def gpu_unhealthy_handler(loop: SchedulingLoop) -> Handler[SchedulerUnitOfWork]:
    """A GPU went bad: new pods avoid it (its pods stay; telemetry and operators decide about them)."""

    async def handle_gpu_unhealthy(envelope: Envelope, uow: SchedulerUnitOfWork) -> None:
        event = parse_as(envelope, GpuUnhealthy)
        await uow.repo.mark_gpu_unhealthy(event.node, event.gpu_uuid)
        uow.after_commit(lambda: loop.gpu_unhealthy(event.node, event.gpu_index))

    return handle_gpu_unhealthy


def preemption_requested_handler(loop: SchedulingLoop) -> Handler[SchedulerUnitOfWork]:
    """Admission wants a victim's quota back: the loop evicts it when the request is due."""

    async def handle_preemption_requested(envelope: Envelope, uow: SchedulerUnitOfWork) -> None:
        event = parse_as(envelope, PreemptionRequested)
        await uow.repo.add_preemption(event)
        uow.after_commit(loop.wake)

    return handle_preemption_requested


def ready_for_eviction_handler(loop: SchedulingLoop) -> Handler[SchedulerUnitOfWork]:
    """The checkpoint service let a checkpointable victim go (saved, failed or timed out): the loop
    evicts it now rather than at its deadline. A node's termination (no preemptor) needs nothing
    here: the node drains as it goes."""

    async def handle_ready_for_eviction(envelope: Envelope, uow: SchedulerUnitOfWork) -> None:
        event = parse_as(envelope, ReadyForEviction)
        if not event.preemptor_job_id:
            return
        await uow.repo.mark_ready_for_eviction(event)
        uow.after_commit(loop.wake)

    return handle_ready_for_eviction


def job_finished_handler(loop: SchedulingLoop) -> Handler[SchedulerUnitOfWork]:
    """The job left admission for good: the loop lets go of whatever it holds or waits for."""

    async def handle_job_finished(envelope: Envelope, uow: SchedulerUnitOfWork) -> None:
        event = parse_as(envelope, JobFinished)
        if event.state == "preempted":
            # Evicted through preemption_requested already; the job may be queued and admitted again.
            return
        await uow.repo.add_withdrawal(event.job_id, f"job {event.state}: {event.reason}", event.at)
        uow.after_commit(loop.wake)

    return handle_job_finished
