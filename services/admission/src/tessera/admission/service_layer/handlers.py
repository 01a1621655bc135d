"""Admission's use cases: submit, cancel, outcome reports, and the scheduler's, telemetry's and the
checkpoint service's news. The admission cycle itself is in `cycle.py`.

Each one changes jobs through the `Job` aggregate and saves them through `uow.jobs`; the unit of
work publishes what the jobs recorded when it commits. Whatever may change the cycle's view holds
the cycle off until commit (`uow.gate.hold_off`) and moves the change mark, so a cycle runs next."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tessera.admission.domain.model import InvalidTransition, Job, JobCheckpoint, JobState
from tessera.admission.domain.queueing import QueueingEngine, QueueingValidationError
from tessera.admission.domain.templates import job_template_errors
from tessera.admission.domain.workloads import groups_of, open_config, tenant_queue, to_workload
from tessera.admission.service_layer.configuration import usable_config
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork
from tessera.contracts.base import FieldError
from tessera.contracts.events import (
    CheckpointSaved,
    GangFinished,
    GangPlaced,
    GangUnschedulable,
    InventoryChanged,
    ReportJobOutcome,
    SubmitJob,
    checkpoint_id,
)
from tessera.contracts.jobs import JobSpec
from tessera.contracts.validation import parse_job_spec
from tessera.core.messaging.consumer import PermanentError
from tessera.core.messaging.envelope import Envelope
from tessera.core.observability.tracing import current_trace_headers, tracer

log = logging.getLogger(__name__)


def now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class SubmitResult:
    job_id: str
    state: JobState
    errors: list[FieldError] = field(default_factory=list)
    duplicate: bool = False


async def _queueing_view(
    uow: AdmissionUnitOfWork, spec: JobSpec, job_id: str
) -> tuple[str, int, dict[str, Any]]:
    """The queue, priority and workload of a valid spec; raises `QueueingValidationError`."""
    stored = await uow.config.load()
    groups = groups_of(spec)
    open_mode = stored.open_mode
    config = open_config({r for g in groups for r in g["requests"]}) if open_mode else usable_config(stored)
    queue = tenant_queue(config, spec.tenant, spec.queue, open_mode)
    priority = config.priority_of(spec.priority_class) if spec.priority_class else spec.priority
    workload = to_workload(
        job_id,
        queue,
        groups,
        priority=priority,
        created_at=0.0,
        preemptible=spec.preemptible,
        checkpointable=spec.checkpointable,
        config=config,
        open_mode=open_mode,
    )
    QueueingEngine(config).validate(workload)
    return (
        queue,
        priority,
        {
            "groups": groups,
            "preemptible": spec.preemptible,
            "checkpointable": spec.checkpointable,
        },
    )


def _has_templates(spec: JobSpec) -> bool:
    return any(group.template is not None for group in spec.pod_groups)


async def _known_tenants(uow: AdmissionUnitOfWork) -> set[str]:
    """The tenants admission knows of, by their tenant queues and tokens: whose object a name in the
    shared namespace is (`tenant_objects`)."""
    stored = await uow.config.load()
    return {tq.tenant for tq in stored.tenant_queues} | {
        t.tenant for t in await uow.tokens.list() if t.tenant is not None
    }


async def submit_job(
    raw_spec: object,
    uow: AdmissionUnitOfWork,
    job_id: str | None = None,
    *,
    templates_required: bool = False,
    shared_namespace: bool = True,
) -> SubmitResult:
    """Validate, store and announce a job. Called inside an open unit of work; the caller commits.
    A job id seen before answers with that job, unchanged (an idempotent resubmission).
    ``templates_required``: every pod group must carry a pod template (admission runs the job's
    workloads on a cluster, so it needs the image to run). ``shared_namespace`` False for a user's
    own workload that admission adopted: its pods run in the user's namespace with the user's rights,
    not in the namespace tenants share, so the shared-namespace template rules are not for it."""
    job_id = job_id or str(uuid.uuid4())
    with tracer().start_as_current_span("admission.submit_job", attributes={"job_id": job_id}) as span:
        existing = await uow.jobs.get(job_id)
        if existing is not None:
            return SubmitResult(job_id, existing.state, existing.errors, duplicate=True)
        spec, errors = parse_job_spec(raw_spec)
        workload: dict[str, Any] | None = None
        job: Job | None = None
        if spec is not None:
            known = await _known_tenants(uow) if shared_namespace and _has_templates(spec) else set()
            errors = job_template_errors(
                spec, required=templates_required, shared_namespace=shared_namespace, tenants=known
            )
            if errors:
                raw_spec, spec = spec.model_dump(mode="json"), None
        if spec is not None:
            try:
                queue, priority, workload = await _queueing_view(uow, spec, job_id)
                job = Job.submit(job_id, spec, now(), queue=queue, priority=priority)
            except QueueingValidationError as exc:
                errors = [FieldError(field=exc.field, reason=exc.reason)]
                raw_spec = spec.model_dump(mode="json")
        if job is None:
            job = Job.reject(job_id, raw_spec, errors, now())
            workload = None
        span.set_attribute("accepted", job.state is JobState.QUEUED)
        job.trace_headers = current_trace_headers()  # the job's whole story follows this trace
        await uow.jobs.add(job, workload=workload)
        await uow.gate.mark_changed()
        log.info("job %s", job.state, extra={"job_id": job_id, "errors": len(errors)})
        return SubmitResult(job_id, job.state, errors)


async def handle_submit_command(
    envelope: Envelope, uow: AdmissionUnitOfWork, *, templates_required: bool = False
) -> None:
    command = envelope.parse()
    if not isinstance(command, SubmitJob):
        raise PermanentError(f"admission-submit takes {SubmitJob.TYPE}, not {envelope.type}")
    await submit_job(command.spec, uow, command.job_id or envelope.id, templates_required=templates_required)


class JobNotFound(LookupError):
    pass


async def cancel_job(job_id: str, uow: AdmissionUnitOfWork, reason: str = "cancelled by request") -> Job:
    """Cancel a job; its quota is free for the next cycle. Raises `JobNotFound`, `InvalidTransition`."""
    await uow.gate.hold_off()
    job = await uow.jobs.get(job_id, for_update=True)
    if job is None:
        raise JobNotFound(job_id)
    job.cancel(reason, now())
    await uow.jobs.save(job)
    await uow.gate.mark_changed()
    return job


OUTCOMES = {
    "running": JobState.RUNNING,
    "succeeded": JobState.SUCCEEDED,
    "failed": JobState.FAILED,
    "preempted": JobState.PREEMPTED,
}


async def report_outcome(job_id: str, state: str, reason: str, uow: AdmissionUnitOfWork) -> Job | None:
    """A job runs, ends, or has released its resources after a preemption request. None when the
    job is unknown or the report does not fit its state (a late or repeated report)."""
    target = OUTCOMES.get(state)
    if target is None:
        raise QueueingValidationError("state", f"one of {', '.join(OUTCOMES)}; got {state!r}")
    await uow.gate.hold_off()
    await uow.gate.job_events_in_turn()
    job = await uow.jobs.get(job_id, for_update=True)
    if job is None:
        log.warning("outcome for an unknown job", extra={"job_id": job_id})
        return None
    try:
        changed = job.report(target, reason, now())
    except InvalidTransition as exc:
        log.info("outcome ignored: %s", exc, extra={"job_id": job_id})
        return None
    if not changed:
        log.info("outcome %s already known: the job is %s", state, job.state, extra={"job_id": job_id})
        return job
    await uow.jobs.save(job)
    if not job.holds_quota:
        await uow.inventory.release_placement(job_id)
    await uow.gate.mark_changed()
    return job


async def handle_outcome_command(envelope: Envelope, uow: AdmissionUnitOfWork) -> None:
    command = envelope.parse()
    if not isinstance(command, ReportJobOutcome):
        raise PermanentError(f"admission-outcomes takes {ReportJobOutcome.TYPE}, not {envelope.type}")
    try:
        await report_outcome(command.job_id, command.state, command.reason, uow)
    except QueueingValidationError as exc:
        log.warning("bad outcome report: %s", exc, extra={"job_id": command.job_id})


async def handle_scheduler_event(envelope: Envelope, uow: AdmissionUnitOfWork) -> None:
    """The scheduler placed a gang, cannot place it, or every pod of it ended. Other scheduler
    events (evicted pods, demand) change nothing here: an evicted gang is placed again, or its
    release comes as an outcome report."""
    event = envelope.parse()
    if isinstance(event, GangFinished):
        ended = ", ".join(f"{pod} {phase}" for pod, phase in sorted(event.pods.items()))
        state = "succeeded" if event.succeeded else "failed"
        await report_outcome(event.job_id, state, f"every pod ended: {ended}" if ended else state, uow)
        return
    if not isinstance(event, GangPlaced | GangUnschedulable):
        return
    await uow.gate.hold_off()
    await uow.gate.job_events_in_turn()
    job = await uow.jobs.get(event.job_id, for_update=True)
    if job is None:
        log.warning("scheduler outcome for an unknown job", extra={"job_id": event.job_id})
        return
    at = now()
    changed = True
    try:
        if isinstance(event, GangPlaced):
            changed = job.place(len(event.placements), [p.node for p in event.placements], at)
        else:
            job.unschedulable(event.message, at)
    except InvalidTransition as exc:
        log.info("scheduler outcome ignored: %s", exc, extra={"job_id": job.id})
        return
    if changed:
        await uow.jobs.save(job)
    else:
        log.info("placement came after the job was %s: state kept", job.state, extra={"job_id": job.id})
    if isinstance(event, GangPlaced) and job.holds_quota:  # a running job holds the GPUs it was placed on
        await uow.inventory.record_placement(
            job.id, [p.model_dump(mode="json") for p in event.placements], at
        )
        await uow.gate.mark_changed()


async def handle_inventory(envelope: Envelope, uow: AdmissionUnitOfWork) -> None:
    """Keep admission's own copy of the node and GPU inventory telemetry publishes (per source)."""
    event = envelope.parse()
    if not isinstance(event, InventoryChanged):
        raise PermanentError(f"admission-inventory takes {InventoryChanged.TYPE}, not {envelope.type}")
    await uow.gate.hold_off()
    nodes = {node.name: [g.model_dump(mode="json") for g in node.gpus] for node in event.nodes}
    labels = {node.name: dict(node.labels) for node in event.nodes}
    await uow.inventory.replace_source(event.source, nodes, now(), labels)
    await uow.gate.mark_changed()


async def handle_checkpoint_saved(envelope: Envelope, uow: AdmissionUnitOfWork) -> None:
    """A job's checkpoint is durable (periodic, or asked for before a preemption or a node's loss):
    record it once, say so in the job's history, and the job resumes from its newest one when it is
    admitted again. A checkpoint of a job admission does not know is dropped."""
    event = envelope.parse()
    if not isinstance(event, CheckpointSaved):
        raise PermanentError(f"admission-checkpoints takes {CheckpointSaved.TYPE}, not {envelope.type}")
    await uow.gate.hold_off()
    await uow.gate.job_events_in_turn()
    job = await uow.jobs.get(event.job_id, for_update=True)
    if job is None:
        log.info("checkpoint of a job admission does not know", extra={"job_id": event.job_id})
        return
    checkpoint = JobCheckpoint(
        checkpoint_id(event.job_id, event.uri), event.step, event.size_bytes, event.uri, event.at
    )
    if not await uow.checkpoints.add(job.id, checkpoint, event.request_id):
        return  # announced again: recorded already
    job.checkpoint_saved(checkpoint, now())
    await uow.jobs.save(job)
