"""One admission cycle through the service: lock, rebuild, decide, persist, announce.

Everything happens in one transaction holding a transaction-level advisory lock, so two
replicas never run a cycle at the same time (the second waits, then sees the first one's
admissions) and a crash anywhere before commit leaves no trace: the next cycle decides again."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate
from sqlalchemy import bindparam, delete, insert, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from tessera.admission.adapters.orm import (
    draining_victims,
    fair_share_history,
    inflight_preemptions,
    job_transitions,
    jobs,
)
from tessera.admission.adapters.outbox_batch import OutboxBatch
from tessera.admission.domain.model import JobState
from tessera.admission.domain.queueing import Admit, Preempt, Wait
from tessera.admission.service_layer.cycle_state import (
    ActiveJob,
    CycleState,
    encode_usage,
    load_cycle_state,
)
from tessera.contracts.events import (
    JobAdmitted,
    JobFinished,
    JobStateChanged,
    PreemptionRequested,
)
from tessera.contracts.jobs import JobSpec
from tessera.core.db.uow import UnitOfWork
from tessera.core.observability.tracing import current_trace_headers, tracer

log = logging.getLogger(__name__)

CYCLE_LOCK_KEY = 0x7E55E7A_AD
"""pg_advisory_xact_lock key of the admission cycle (one cycle at a time across replicas)."""
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
    uow: UnitOfWork,
    now: datetime | None = None,
    before_commit: Callable[[], None] | None = None,
    after_load: Callable[[], Awaitable[None]] | None = None,
) -> CycleReport:
    """Run one cycle in `uow` and commit it. The hooks are seams for fault and race tests."""
    now = now or datetime.now(UTC)
    session = uow.session
    await session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": CYCLE_LOCK_KEY})
    with tracer().start_as_current_span("admission.cycle") as span:
        state = await load_cycle_state(session, now)
        if after_load is not None:
            await after_load()
        result = state.engine.run_cycle(now.timestamp(), state.oracle)
        report = CycleReport(waiting=len(result.waits), examined=result.examined)
        out = OutboxBatch(uow)
        writer = _Writer(state, now, out)
        await writer.persist(result.decisions, report)
        await writer.note_inadmissible()
        await writer.flush()
        await _save_preemptions(uow, state)
        await _save_fair_share(uow, state, now)
        await out.flush()
        span.set_attribute("admitted", len(report.admitted))
        span.set_attribute("examined", report.examined)
        deadlines = [r.deadline for r in state.engine.inflight_preemptions().values()]
        report.next_deadline = _at(min(deadlines)) if deadlines else None
    if before_commit is not None:
        before_commit()
    await uow.commit()
    if report.admitted or report.preemptions:
        log.info(
            "admission cycle",
            extra={"admitted": len(report.admitted), "preemptions": len(report.preemptions)},
        )
    return report


class _Writer:
    """Turns decisions into row updates, history entries and events, written in bulk."""

    def __init__(self, state: CycleState, now: datetime, out: OutboxBatch) -> None:
        self.state = state
        self.now = now
        self.out = out
        self.transitions: list[dict[str, Any]] = []
        self.admits: list[dict[str, Any]] = []
        self.waits: list[dict[str, Any]] = []
        self.victims: list[dict[str, Any]] = []
        self.preempted: list[dict[str, Any]] = []

    async def persist(self, decisions: list[Admit | Preempt | Wait], report: CycleReport) -> None:
        admits = [d for d in decisions if isinstance(d, Admit)]
        specs = await self._specs([a.job for a in admits])
        for decision in decisions:
            if isinstance(decision, Admit):
                self._admit(decision, specs[decision.job])
                report.admitted.append(decision.job)
            elif isinstance(decision, Preempt):
                self._preempt(decision)
                (report.released if decision.forced else report.preemptions).append(decision.victim)
            else:
                self._wait(self.state.jobs[decision.job], decision.reason.value, decision.message)

    async def note_inadmissible(self) -> None:
        for job_id, message in self.state.inadmissible.items():
            self._wait(self.state.jobs[job_id], INADMISSIBLE, message)

    async def _specs(self, ids: list[str]) -> dict[str, tuple[JobSpec, datetime, dict[str, str]]]:
        if not ids:
            return {}
        session = self.out.uow.session
        rows = await session.execute(
            select(jobs.c.id, jobs.c.spec, jobs.c.submitted_at, jobs.c.trace_headers).where(
                jobs.c.id.in_(ids)
            )
        )
        return {r.id: (JobSpec.model_validate(r.spec), r.submitted_at, dict(r.trace_headers)) for r in rows}

    def _admit(self, d: Admit, found: tuple[JobSpec, datetime, dict[str, str]]) -> None:
        spec, submitted_at, trace = found
        job = self.state.jobs[d.job]
        where = ", ".join(sorted(set(d.flavors)))
        reason = f"admitted to queue {d.queue} in flavor {where}" + (" (borrowing)" if d.borrows else "")
        token = otel_context.attach(propagate.extract(trace))
        try:
            with tracer().start_as_current_span("admission.admit", attributes={"job_id": d.job}):
                headers = current_trace_headers()
                self.out.add(JobAdmitted(job_id=d.job, spec=spec, submitted_at=submitted_at), headers)
                self.out.add(self._changed(job, JobState.ADMITTED.value, reason), headers)
        finally:
            otel_context.detach(token)
        self.admits.append({"b_id": d.job, "b_flavors": list(d.flavors)})
        self.transitions.append({"job_id": d.job, "state": "admitted", "reason": reason, "at": self.now})

    def _preempt(self, d: Preempt) -> None:
        job = self.state.jobs[d.victim]
        engine_victim = self.state.engine
        checkpointable = False
        if engine_victim.is_admitted(d.victim):
            checkpointable = engine_victim.admitted(d.victim).workload.checkpointable
        deadline = _at(d.deadline)
        self.out.add(
            PreemptionRequested(
                victim_job_id=d.victim,
                preemptor_job_id=d.preemptor,
                reason=d.reason.value,
                deadline=deadline,
                grace_period_s=d.grace_period_s,
                checkpointable=checkpointable,
                forced=d.forced,
            )
        )
        if d.forced:
            reason = f"preempted by {d.preemptor} ({d.reason.value}): release deadline passed"
            self.preempted.append({"b_id": d.victim})
            self.transitions.append(
                {"job_id": d.victim, "state": "preempted", "reason": reason, "at": self.now}
            )
            self.out.add(self._changed(job, JobState.PREEMPTED.value, reason))
            self.out.add(JobFinished(job_id=d.victim, state="preempted", reason=reason, at=self.now))
            return
        reason = (
            f"preemption requested by {d.preemptor} ({d.reason.value}); grace {d.grace_period_s:g}s, "
            f"deadline {deadline.isoformat()}"
        )
        self.victims.append({"b_id": d.victim, "b_by": d.preemptor, "b_deadline": deadline})
        self.transitions.append(
            {"job_id": d.victim, "state": job.state.value, "reason": reason, "at": self.now}
        )
        self.out.add(self._changed(job, job.state.value, reason))

    def _wait(self, job: ActiveJob, reason: str, message: str) -> None:
        if job.wait == (reason, message) or job.state is not JobState.QUEUED:
            return
        job.wait = (reason, message)
        text_ = f"waiting: {reason}: {message}"
        self.waits.append({"b_id": job.id, "b_reason": reason, "b_message": message})
        self.transitions.append({"job_id": job.id, "state": "queued", "reason": text_, "at": self.now})
        self.out.add(self._changed(job, "queued", text_))

    def _changed(self, job: ActiveJob, state: str, reason: str) -> JobStateChanged:
        return JobStateChanged(
            job_id=job.id,
            tenant=job.tenant,
            queue=job.queue,
            previous_state=job.state.value,
            state=state,
            reason=reason,
            at=self.now,
        )

    async def flush(self) -> None:
        session = self.out.uow.session
        now = self.now
        if self.admits:
            await session.execute(
                update(jobs)
                .where(jobs.c.id == bindparam("b_id"), jobs.c.state == "queued")
                .values(
                    state="admitted",
                    flavors=bindparam("b_flavors"),
                    admitted_at=now,
                    updated_at=now,
                    wait_reason=None,
                    wait_message=None,
                ),
                self.admits,
            )
        if self.waits:
            await session.execute(
                update(jobs)
                .where(jobs.c.id == bindparam("b_id"))
                .values(wait_reason=bindparam("b_reason"), wait_message=bindparam("b_message")),
                self.waits,
            )
        if self.victims:
            await session.execute(
                update(jobs)
                .where(jobs.c.id == bindparam("b_id"))
                .values(preempted_by=bindparam("b_by"), preemption_deadline=bindparam("b_deadline")),
                self.victims,
            )
        if self.preempted:
            await session.execute(
                update(jobs).where(jobs.c.id == bindparam("b_id")).values(state="preempted", updated_at=now),
                self.preempted,
            )
        if self.transitions:
            await session.execute(insert(job_transitions), self.transitions)


async def _save_preemptions(uow: UnitOfWork, state: CycleState) -> None:
    """The in-flight preemptions and draining victims as the engine leaves them."""
    session = uow.session
    engine = state.engine
    await session.execute(delete(inflight_preemptions))
    await session.execute(delete(draining_victims))
    records = list(engine.inflight_preemptions().values())
    if not records:
        return
    await session.execute(
        insert(inflight_preemptions),
        [
            {
                "preemptor": r.preemptor,
                "victims": list(r.victims),
                "requested_at": _at(r.requested_at),
                "deadline": _at(r.deadline),
                "flavors": list(r.flavors),
                "usage": encode_usage(r.usage),
            }
            for r in records
        ],
    )
    draining = {}
    for r in records:
        for victim in r.victims:
            if engine.is_admitted(victim) and engine.admitted(victim).being_preempted:
                d = engine.draining(victim)
                draining[victim] = {
                    "victim": victim,
                    "preemptor": d.preemptor,
                    "reason": d.reason.value,
                    "deadline": _at(d.deadline),
                }
    if draining:
        await session.execute(insert(draining_victims), list(draining.values()))


async def _save_fair_share(uow: UnitOfWork, state: CycleState, now: datetime) -> None:
    engine = state.engine
    if not engine.fair_share.enabled:
        return
    rows = [
        {
            "queue": q,
            "history": {f"{f}|{r}": v for (f, r), v in engine.fair_share.history(q).items()},
            "sampled_at": now,
        }
        for q in state.config.queues
    ]
    stmt = pg_insert(fair_share_history)
    await uow.session.execute(
        stmt.on_conflict_do_update(
            index_elements=[fair_share_history.c.queue],
            set_={"history": stmt.excluded.history, "sampled_at": stmt.excluded.sampled_at},
        ),
        rows,
    )
