"""Reconciliation: admission's view of the jobs that hold quota, compared with the cluster, repaired
where the cluster leaves no doubt (`domain.reconcile.propose`).

A pass reads the jobs admitted, placed or running and what the API shows of each (its pods' phases,
its Jobs), and proposes repairs. Each repair is applied in a transaction of its own, on the job read
again under lock, and only when the job is as the pass saw it and has not changed for ``grace``: a
job whose events are still on their way is left to them. Every repair is logged with the job id and
its reason, and recorded in the job's history."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from tessera.admission.domain.model import HOLDS_QUOTA, JobState
from tessera.admission.domain.reconcile import ClusterView, Proposal, Repair, expected_pods, propose
from tessera.admission.domain.workload_sync import Applied
from tessera.admission.service_layer.ports import WorkloadCluster
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork

log = logging.getLogger(__name__)

REPORTED = {
    Repair.RUNNING: JobState.RUNNING,
    Repair.SUCCEEDED: JobState.SUCCEEDED,
    Repair.FAILED: JobState.FAILED,
}


@dataclass(frozen=True)
class Repaired:
    job_id: str
    repair: Repair
    reason: str


async def reconcile(
    uow: Callable[[], AdmissionUnitOfWork],
    cluster: WorkloadCluster,
    now: datetime,
    grace: timedelta,
) -> list[Repaired]:
    """One pass; returns the repairs it made. Raises `WorkloadError` when the API does not answer."""
    async with uow() as work:
        holding = [job for job in await work.jobs.active() if job.state in HOLDS_QUOTA]
        users = {job_id for job_id, _, _ in await work.workloads.user_owned()}
        made = {
            job.id
            for job in holding
            if job.state is JobState.ADMITTED
            and job.id not in users
            and (record := await work.workloads.of_job(job.id)) is not None
            and record[2] is Applied.RUNNING
        }
    if not holding:
        return []
    views = await cluster.job_views()
    proposals = [
        (job.id, job.state, proposal)
        for job in holding
        if (
            proposal := propose(
                job.state, expected_pods(job.workload), views.get(job.id, ClusterView()), job.id in made
            )
        )
    ]
    repaired = []
    for job_id, seen_as, proposal in proposals:
        if await _repair(uow, job_id, seen_as, proposal, now, grace):
            log.warning(
                "job repaired by reconciliation: %s",
                proposal.reason,
                extra={"job_id": job_id, "repair": proposal.repair.value},
            )
            repaired.append(Repaired(job_id, proposal.repair, proposal.reason))
    return repaired


async def _repair(
    uow: Callable[[], AdmissionUnitOfWork],
    job_id: str,
    seen_as: JobState,
    proposal: Proposal,
    now: datetime,
    grace: timedelta,
) -> bool:
    async with uow() as work:
        await work.gate.hold_off()
        job = await work.jobs.get(job_id, for_update=True)
        if job is None or job.state is not seen_as or (job.history and now - job.history[-1].at < grace):
            return False  # changed since the pass looked, or changed too recently: its events decide
        reason = f"reconciled: {proposal.reason}"
        if proposal.repair is Repair.RECREATE:
            await work.workloads.forget(job_id)
            job.note(f"{reason}; its objects are made again", now)
        elif not job.report(REPORTED[proposal.repair], reason, now):
            return False
        await work.jobs.save(job)
        if not job.holds_quota:
            await work.inventory.release_placement(job_id)
        await work.gate.mark_changed()
        await work.commit()
    return True
