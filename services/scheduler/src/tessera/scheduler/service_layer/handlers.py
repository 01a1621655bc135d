"""The scheduler's use cases: learn the inventory, and place admitted gangs all-or-nothing."""

from __future__ import annotations

import copy
import logging

from tessera.contracts.events import GangPlaced, GangUnschedulable, InventoryChanged, JobAdmitted
from tessera.contracts.jobs import JobSpec
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.envelope import Envelope
from tessera.core.observability.tracing import tracer
from tessera.scheduler.adapters.repository import SchedulerRepository
from tessera.scheduler.domain.first_fit import FreeNode, place_gang

log = logging.getLogger(__name__)


async def _try_place(
    repo: SchedulerRepository,
    uow: UnitOfWork,
    job_id: str,
    spec: JobSpec,
    nodes: list[FreeNode],
    *,
    announce_failure: bool,
) -> list[FreeNode]:
    """Try one gang against `nodes`; returns the free view after the decision."""
    with tracer().start_as_current_span("scheduler.place_gang", attributes={"job_id": job_id}) as span:
        scratch = copy.deepcopy(nodes)
        fit = place_gang(spec.name, spec, scratch)
        span.set_attribute("placed", fit.placed)
        if fit.placed:
            await repo.record_placement(job_id, spec, fit.placements)
            await uow.publish(GangPlaced(job_id=job_id, placements=fit.placements))
            log.info("gang placed", extra={"job_id": job_id, "pods": len(fit.placements)})
            return scratch
        span.set_attribute("reasons", fit.message())
        await repo.record_unschedulable(job_id, fit.message())
        if announce_failure:
            await uow.publish(
                GangUnschedulable(job_id=job_id, message=fit.message(), rejected_nodes=fit.rejected)
            )
        log.info("gang unschedulable", extra={"job_id": job_id, "reasons": fit.message()})
        return nodes


async def retry_pending(repo: SchedulerRepository, uow: UnitOfWork) -> None:
    nodes = await repo.free_nodes()
    for job_id, spec in await repo.pending():
        nodes = await _try_place(repo, uow, job_id, spec, nodes, announce_failure=False)


async def handle_job_admitted(envelope: Envelope, uow: UnitOfWork) -> None:
    event = envelope.parse()
    assert isinstance(event, JobAdmitted)
    repo = SchedulerRepository(uow.session)
    await repo.lock_for_decision()
    if await repo.is_placed(event.job_id):
        return
    await repo.add_pending(event.job_id, event.spec, event.submitted_at)
    nodes = await repo.free_nodes()
    await _try_place(repo, uow, event.job_id, event.spec, nodes, announce_failure=True)


async def handle_inventory_changed(envelope: Envelope, uow: UnitOfWork) -> None:
    event = envelope.parse()
    assert isinstance(event, InventoryChanged)
    repo = SchedulerRepository(uow.session)
    await repo.lock_for_decision()
    await repo.replace_inventory(event.source, event.nodes)
    await retry_pending(repo, uow)
