"""The scheduler's message handlers: record what arrived, then wake the scheduling loop after commit.

Decisions are never taken in a handler: the loop takes them one cycle at a time under the
scheduler's lock, so a redelivered or batched message only ever queues a gang once.
"""

from __future__ import annotations

from tessera.contracts.events import (
    GpuUnhealthy,
    InventoryChanged,
    JobAdmitted,
    JobFinished,
    PreemptionRequested,
)
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.consumer import Handler, PermanentError
from tessera.core.messaging.envelope import Envelope
from tessera.core.observability.tracing import current_trace_headers
from tessera.scheduler.adapters.repository import SchedulerRepository
from tessera.scheduler.service_layer.engine import SchedulingEngine


def job_admitted_handler(engine: SchedulingEngine) -> Handler[UnitOfWork]:
    async def handle_job_admitted(envelope: Envelope, uow: UnitOfWork) -> None:
        event = envelope.parse()
        if not isinstance(event, JobAdmitted):
            raise PermanentError(f"expected job_admitted, got {envelope.type}")
        repo = SchedulerRepository.of(uow)
        if await repo.is_placed(event.job_id):
            return
        if await repo.add_pending(
            event.job_id, event.spec, event.submitted_at, trace=current_trace_headers()
        ):
            repo.after_commit(engine.wake)

    return handle_job_admitted


def inventory_changed_handler(engine: SchedulingEngine) -> Handler[UnitOfWork]:
    async def handle_inventory_changed(envelope: Envelope, uow: UnitOfWork) -> None:
        event = envelope.parse()
        if not isinstance(event, InventoryChanged):
            raise PermanentError(f"expected inventory_changed, got {envelope.type}")
        repo = SchedulerRepository.of(uow)
        await repo.replace_inventory(event.source, event.nodes)
        repo.after_commit(engine.wake)

    return handle_inventory_changed


def gpu_unhealthy_handler(engine: SchedulingEngine) -> Handler[UnitOfWork]:
    """A GPU went bad: new pods avoid it (its pods stay; telemetry and operators decide about them)."""

    async def handle_gpu_unhealthy(envelope: Envelope, uow: UnitOfWork) -> None:
        event = envelope.parse()
        if not isinstance(event, GpuUnhealthy):
            raise PermanentError(f"expected gpu_unhealthy, got {envelope.type}")
        repo = SchedulerRepository.of(uow)
        await repo.mark_gpu_unhealthy(event.node, event.gpu_uuid)
        repo.after_commit(lambda: engine.gpu_unhealthy(event.node, event.gpu_index))

    return handle_gpu_unhealthy


def preemption_requested_handler(engine: SchedulingEngine) -> Handler[UnitOfWork]:
    """Admission wants a victim's quota back: the loop evicts it when the request is due."""

    async def handle_preemption_requested(envelope: Envelope, uow: UnitOfWork) -> None:
        event = envelope.parse()
        if not isinstance(event, PreemptionRequested):
            raise PermanentError(f"expected preemption_requested, got {envelope.type}")
        repo = SchedulerRepository.of(uow)
        await repo.add_preemption(event)
        repo.after_commit(engine.wake)

    return handle_preemption_requested


def job_finished_handler(engine: SchedulingEngine) -> Handler[UnitOfWork]:
    """The job left admission for good: the loop lets go of whatever it holds or waits for."""

    async def handle_job_finished(envelope: Envelope, uow: UnitOfWork) -> None:
        event = envelope.parse()
        if not isinstance(event, JobFinished):
            raise PermanentError(f"expected job_finished, got {envelope.type}")
        if event.state == "preempted":
            # Evicted through preemption_requested already; the job may be queued and admitted again.
            return
        repo = SchedulerRepository.of(uow)
        await repo.add_withdrawal(event.job_id, f"job {event.state}: {event.reason}", event.at)
        repo.after_commit(engine.wake)

    return handle_job_finished
