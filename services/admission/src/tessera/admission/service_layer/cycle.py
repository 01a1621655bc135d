"""One admission cycle through the service: lock, rebuild, decide, apply, save, announce.

Everything happens in one transaction holding a transaction-level advisory lock, so two
replicas never run a cycle at the same time (the second waits, then sees the first one's
admissions) and a crash anywhere before commit leaves no trace: the next cycle decides again.

The queueing engine decides; each decision is applied to its `Job` through the aggregate's own
transitions (admit, request or force a preemption, wait), so the job's rules live in one place.
The jobs are loaded and saved in bulk, and the unit of work writes the events they recorded."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from tessera.admission.domain.model import Job
from tessera.admission.domain.queueing import Admit, CycleResult, Preempt, Wait
from tessera.admission.service_layer.cycle_state import CycleState, load_cycle_state
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork
from tessera.core.observability.tracing import current_trace_headers, tracer

log = logging.getLogger(__name__)

INADMISSIBLE = "Inadmissible"


@dataclass
class CycleReport:
    admitted: list[str] = field(default_factory=list)
    preemptions: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    waiting: int = 0
    examined: int = 0
    next_deadline: datetime | None = None


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


async def run_cycle(
    uow: AdmissionUnitOfWork,
    now: datetime | None = None,
    before_commit: Callable[[], None] | None = None,
    after_load: Callable[[], Awaitable[None]] | None = None,
    observe: Callable[[CycleState, CycleReport, datetime], None] | None = None,
) -> CycleReport:
    """Run one cycle in `uow` and commit it. The hooks are seams for fault and race tests;
    `observe` sees the committed cycle (the service's metrics)."""
    await uow.gate.lock()
    # the clock is read once the lock is held: a job queued while this cycle waited for it is then
    # never stamped with a time before its own
    now = now or datetime.now(UTC)
    with tracer().start_as_current_span("admission.cycle") as span:
        state = await load_cycle_state(uow, now)
        if after_load is not None:
            await after_load()
        result = state.engine.run_cycle(now.timestamp(), state.oracle)
        report = await apply_decisions(uow, state, result, now)
        await _save_engine_records(uow, state, now)
        await uow.flush_events()  # inside the cycle's span: events of jobs without a trace join it
        span.set_attribute("admitted", len(report.admitted))
        span.set_attribute("examined", report.examined)
        span.set_attribute("waiting", report.waiting)
        span.set_attribute("preemptions", len(report.preemptions) + len(report.released))
        deadlines = [r.deadline for r in state.engine.inflight_preemptions().values()]
        report.next_deadline = _at(min(deadlines)) if deadlines else None
    if before_commit is not None:
        before_commit()
    await uow.commit()
    if observe is not None:
        observe(state, report, now)
    if report.admitted or report.preemptions:
        log.info(
            "admission cycle",
            extra={"admitted": len(report.admitted), "preemptions": len(report.preemptions)},
        )
    return report


async def change_mark(uow: AdmissionUnitOfWork) -> int:
    """Moves whenever something a cycle reads changed, in any replica."""
    return await uow.gate.change_mark()


async def apply_decisions(
    uow: AdmissionUnitOfWork, state: CycleState, result: CycleResult, now: datetime
) -> CycleReport:
    """Apply the engine's decisions (and the waits of jobs the configuration no longer takes) to
    the jobs they concern, then save those jobs in one go."""
    report = CycleReport(waiting=len(result.waits), examined=result.examined)
    waits = [(d.job, d.reason.value, d.message) for d in result.decisions if isinstance(d, Wait)]
    waits += [(job_id, INADMISSIBLE, message) for job_id, message in state.inadmissible.items()]
    # A wait the job already records is no news: leave that job unloaded.
    waits = [w for w in waits if state.jobs[w[0]].waiting != (w[1], w[2])]
    # In decision order, so the events go out in the order the engine decided.
    wanted = [
        d.job if isinstance(d, Admit) else d.victim for d in result.decisions if not isinstance(d, Wait)
    ]
    wanted += [job_id for job_id, _, _ in waits]
    jobs = await uow.jobs.get_many(list(dict.fromkeys(wanted)))
    for decision in result.decisions:
        if isinstance(decision, Admit):
            _admit(jobs[decision.job], decision, now)
            report.admitted.append(decision.job)
        elif isinstance(decision, Preempt):
            _preempt(jobs[decision.victim], decision, state, now)
            (report.released if decision.forced else report.preemptions).append(decision.victim)
    for job_id, reason, message in waits:
        job = jobs[job_id]
        with _in_trace_of(job, "admission.wait", job.queue, "waiting", reason, message=message):
            job.wait(reason, message, now)
    await uow.jobs.save_all(jobs.values())
    return report


def _admit(job: Job, d: Admit, now: datetime) -> None:
    where = ", ".join(sorted(set(d.flavors)))
    reason = f"admitted to queue {d.queue} in flavor {where}" + (" (borrowing)" if d.borrows else "")
    with _in_trace_of(job, "admission.admit", d.queue, "admitted", reason, flavor=where, borrowing=d.borrows):
        job.trace_headers = current_trace_headers()  # its events follow from this decision's span
        job.admit(now, reason, d.flavors)


def _preempt(job: Job, d: Preempt, state: CycleState, now: datetime) -> None:
    engine = state.engine
    checkpointable = engine.is_admitted(d.victim) and engine.admitted(d.victim).workload.checkpointable
    apply = job.preempt if d.forced else job.request_preemption
    decision = "preempted" if d.forced else "preemption_requested"
    flavor = ", ".join(sorted(set(job.flavors)))
    with _in_trace_of(
        job,
        "admission.preempt",
        d.victim_queue,
        decision,
        d.reason.value,
        flavor=flavor,
        preemptor=d.preemptor,
    ):
        apply(d.preemptor, d.reason.value, d.grace_period_s, _at(d.deadline), checkpointable, now)


@contextmanager
def _in_trace_of(
    job: Job, name: str, queue: str, decision: str, reason: str, **more: str | bool
) -> Iterator[None]:
    """A span for one decision about `job` (see docs/tracing.md), in the trace the job was
    submitted in, linked to the span of the cycle that decided it."""
    cycle = trace.get_current_span().get_span_context()
    attributes: dict[str, str | bool] = {
        "job_id": job.id,
        "queue": queue,
        "decision": decision,
        "reason": reason,
        **{key: value for key, value in more.items() if value != ""},
    }
    token = otel_context.attach(propagate.extract(job.trace_headers or {}))
    try:
        links = [trace.Link(cycle)] if cycle.is_valid else None
        with tracer().start_as_current_span(name, attributes=attributes, links=links):
            yield
    finally:
        otel_context.detach(token)


async def _save_engine_records(uow: AdmissionUnitOfWork, state: CycleState, now: datetime) -> None:
    """The in-flight preemptions, draining victims and fair-share history as the engine leaves them."""
    engine = state.engine
    inflight = list(engine.inflight_preemptions().values())
    draining = {
        victim: engine.draining(victim)
        for r in inflight
        for victim in r.victims
        if engine.is_admitted(victim) and engine.admitted(victim).being_preempted
    }
    await uow.cycle_records.save_preemptions(inflight, draining.values())
    if engine.fair_share.enabled:
        await uow.cycle_records.save_fair_share(
            {q: engine.fair_share.history(q) for q in state.config.queues}, now
        )
