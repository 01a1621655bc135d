"""The checkpoint service's use cases, and the message handlers that call them.

Each use case loads what it changes through the unit of work's repositories and changes it through
the aggregates (`Job`, `CheckpointRequest`, `Checkpoint`), which record the events; the unit of work
publishes them on commit. Handlers parse, refuse a wrong type with `PermanentError`, and bind the
clock and the deadline loop's wake from the service's dependencies.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import TypeVar

from tessera.checkpoint.domain.model import (
    DEADLINE_PASSED,
    NOT_CHECKPOINTABLE,
    PREEMPTION,
    Answer,
    Checkpoint,
    CheckpointRequest,
)
from tessera.checkpoint.service_layer.dependencies import CheckpointDeps
from tessera.checkpoint.service_layer.unit_of_work import CheckpointUnitOfWork
from tessera.contracts.base import Message
from tessera.contracts.events import (
    GangFinished,
    GangPlaced,
    JobAdmitted,
    JobFinished,
    PreemptionRequested,
    ReportCheckpoint,
)
from tessera.core.messaging.consumer import Handler, PermanentError
from tessera.core.messaging.envelope import Envelope
from tessera.core.observability.tracing import current_trace_headers

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)
_REQUEST_IDS = uuid.UUID("5d0f3b9e-7c1a-4f8e-8a59-1e2b6c9d4f30")


def request_id_for(message_id: str) -> str:
    """The request a message causes has an id of its own, derived from the message's (for tracing)."""
    return str(uuid.uuid5(_REQUEST_IDS, message_id))


# --- use cases -------------------------------------------------------------------------------------


async def request_preemption_checkpoint(
    uow: CheckpointUnitOfWork, event: PreemptionRequested, request_id: str, at: datetime, now: datetime
) -> CheckpointRequest | None:
    """Ask the victim to save before its eviction, or let the eviction go ahead at once when it
    cannot (not checkpointable) or may not wait (forced, or the deadline passed). A job asked once
    already is not asked again: its open request ends with the one `ready_for_eviction`. A preemption
    from before the job ended (`at`: when admission decided it) is news of a run that is gone."""
    job = await uow.jobs.get(event.victim_job_id)
    if job.ended_before(at):
        log.info("preemption of a job that has ended since: ignored", extra={"job_id": job.job_id})
        return None
    job.told_checkpointable(event.checkpointable)
    await uow.jobs.save(job)
    preemptor = event.preemptor_job_id
    pending = await uow.requests.open_for(job.job_id)
    if pending is not None and pending.also_for(event.deadline, now, preemptor_job_id=preemptor):
        await uow.requests.save(pending)
    if event.forced or event.deadline <= now:
        latest = await uow.checkpoints.latest(job.job_id)
        if pending is not None:
            pending.overtaken(latest, now)
            await uow.requests.save(pending)
        else:
            job.release_now(DEADLINE_PASSED, latest, now, cause=PREEMPTION, preemptor_job_id=preemptor)
        log.info("preemption deadline passed: ready for eviction", extra={"job_id": job.job_id})
        return None
    if pending is not None:
        return None
    if not event.checkpointable:
        latest = await uow.checkpoints.latest(job.job_id)
        job.release_now(NOT_CHECKPOINTABLE, latest, now, cause=PREEMPTION, preemptor_job_id=preemptor)
        log.info("not checkpointable: ready for eviction", extra={"job_id": job.job_id})
        return None
    request = CheckpointRequest.ask(
        request_id,
        job.job_id,
        PREEMPTION,
        event.deadline,
        now,
        preemptor_job_id=preemptor,
        trace_headers=current_trace_headers(),
    )
    if not await uow.requests.add(request):
        return None
    log.info(
        "asked to checkpoint before preemption",
        extra={"job_id": job.job_id, "request_id": request_id, "deadline": event.deadline.isoformat()},
    )
    return request


async def record_report(uow: CheckpointUnitOfWork, report: ReportCheckpoint, now: datetime) -> Answer | None:
    """Record a saved checkpoint (once, however often it is reported) and end the request the report
    answers. None for a periodic report, or one for a request this service does not know."""
    checkpoint = Checkpoint.reported(report) if report.outcome == "saved" else None
    if checkpoint is not None and await uow.checkpoints.add(checkpoint):
        log.info(
            "checkpoint saved",
            extra={"job_id": report.job_id, "step": report.step, "uri": report.uri},
        )
    if report.request_id is None:
        if checkpoint is None:
            log.warning("periodic checkpoint failed", extra={"job_id": report.job_id, "why": report.reason})
        return None
    request = await uow.requests.get(report.request_id)
    if request is None:
        log.warning("report for an unknown request", extra={"job_id": report.job_id})
        return None
    latest = checkpoint if checkpoint is not None else await uow.checkpoints.latest(request.job_id)
    answer = request.answer(report, checkpoint, latest, now)
    if answer is Answer.ANSWERED:
        await uow.requests.save(request)
    log.info(
        "checkpoint request %s", answer.value, extra={"job_id": request.job_id, "state": request.state.value}
    )
    return answer


async def job_admitted(uow: CheckpointUnitOfWork, event: JobAdmitted, at: datetime) -> None:
    job = await uow.jobs.get(event.job_id)
    job.admitted(event.spec.checkpointable, at)
    await uow.jobs.save(job)


async def gang_placed(uow: CheckpointUnitOfWork, event: GangPlaced, at: datetime) -> None:
    job = await uow.jobs.get(event.job_id)
    if job.placed({p.pod: p.node for p in event.placements}, at):
        await uow.jobs.save(job)


async def gang_finished(uow: CheckpointUnitOfWork, event: GangFinished, at: datetime) -> None:
    job = await uow.jobs.get(event.job_id)
    job.gang_ended(at)
    await uow.jobs.save(job)


async def job_finished(uow: CheckpointUnitOfWork, event: JobFinished, now: datetime) -> None:
    """The job left: forget where it ran, and stop waiting for a checkpoint nobody will evict it for."""
    job = await uow.jobs.get(event.job_id)
    if not job.finish(event.at):
        return  # an earlier run's end, delivered after the job was admitted again: not this run's
    await uow.jobs.save(job)
    pending = await uow.requests.open_for(event.job_id)
    if pending is not None:
        pending.cancel(f"job {event.state}: {event.reason}", now)
        await uow.requests.save(pending)


# --- handlers ---------------------------------------------------------------------------------------


def _parse(envelope: Envelope, kind: type[M]) -> M:
    message = envelope.parse()
    if not isinstance(message, kind):
        raise PermanentError(f"expected {kind.TYPE}, got {envelope.type}")
    return message


def on_preemption_requested(deps: CheckpointDeps) -> Handler[CheckpointUnitOfWork]:
    async def handle_preemption_requested(envelope: Envelope, uow: CheckpointUnitOfWork) -> None:
        event = _parse(envelope, PreemptionRequested)
        request_id = request_id_for(envelope.id)
        if await request_preemption_checkpoint(uow, event, request_id, envelope.time, deps.clock()):
            uow.when_committed(deps.deadline_wake.set)

    return handle_preemption_requested


def on_report_checkpoint(deps: CheckpointDeps) -> Handler[CheckpointUnitOfWork]:
    async def handle_report_checkpoint(envelope: Envelope, uow: CheckpointUnitOfWork) -> None:
        report = _parse(envelope, ReportCheckpoint)
        try:
            await record_report(uow, report, deps.clock())
        except ValueError as exc:  # a saved report without a uri, or one naming another job's request
            raise PermanentError(str(exc)) from exc

    return handle_report_checkpoint


def on_job_admitted(deps: CheckpointDeps) -> Handler[CheckpointUnitOfWork]:
    async def handle_job_admitted(envelope: Envelope, uow: CheckpointUnitOfWork) -> None:
        await job_admitted(uow, _parse(envelope, JobAdmitted), envelope.time)

    return handle_job_admitted


def on_gang_placed(deps: CheckpointDeps) -> Handler[CheckpointUnitOfWork]:
    async def handle_gang_placed(envelope: Envelope, uow: CheckpointUnitOfWork) -> None:
        await gang_placed(uow, _parse(envelope, GangPlaced), envelope.time)

    return handle_gang_placed


def on_gang_finished(deps: CheckpointDeps) -> Handler[CheckpointUnitOfWork]:
    async def handle_gang_finished(envelope: Envelope, uow: CheckpointUnitOfWork) -> None:
        await gang_finished(uow, _parse(envelope, GangFinished), envelope.time)

    return handle_gang_finished


def on_job_finished(deps: CheckpointDeps) -> Handler[CheckpointUnitOfWork]:
    async def handle_job_finished(envelope: Envelope, uow: CheckpointUnitOfWork) -> None:
        await job_finished(uow, _parse(envelope, JobFinished), deps.clock())

    return handle_job_finished
