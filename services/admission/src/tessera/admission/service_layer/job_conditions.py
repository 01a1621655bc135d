"""A job's conditions, written onto its batch/v1 Jobs, its JobSet or its gated Pod
(`domain.job_conditions`).

Level-triggered like the workload sync: each round reads the jobs whose record changed since their
conditions were last written (`uow.workloads.conditions_due`), writes them through the workloads'
status subresource, and records the change it wrote. A change of `QuotaReserved` (reserved, or the
reason it is not, with the numbers) is also an Event on the workload; admitting, preempting and
rejecting have Events of their own where they happen (`workload_sync`, `native_jobs`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from tessera.admission.domain.job_conditions import QUOTA_RESERVED, Condition, ConditionsDue, conditions_for
from tessera.admission.domain.model import JobState
from tessera.admission.service_layer.ports import WorkloadCluster, WorkloadError, WorkloadGone
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork

log = logging.getLogger(__name__)


async def sync_conditions(
    uow: Callable[[], AdmissionUnitOfWork], cluster: WorkloadCluster, limit: int = 100
) -> int:
    """One round; returns how many jobs' conditions it wrote."""
    async with uow() as work:
        due = await work.workloads.conditions_due(limit)
    done = 0
    for item in due:
        ours = conditions_for(item.view)
        try:
            if ours:
                for name in item.jobs:
                    changed = await cluster.set_conditions(item.namespace, name, ours)
                    await _report(cluster, item, name, "Job", changed)
                for name in item.jobsets:
                    changed = await cluster.set_jobset_conditions(item.namespace, name, ours)
                    await _report(cluster, item, name, "JobSet", changed)
                for name in item.pods:
                    changed = await cluster.set_pod_conditions(item.namespace, name, ours)
                    await _report(cluster, item, name, "Pod", changed)
        except WorkloadGone:
            pass  # deleted by its owner: nothing left to describe
        except WorkloadError as error:
            log.warning("job conditions not written: %s", error, extra={"job_id": item.job_id})
            continue
        async with uow() as work:
            await work.workloads.mark_reported(item.job_id, item.updated_at)
            await work.commit()
        done += 1
    return done


async def _report(
    cluster: WorkloadCluster, item: ConditionsDue, name: str, kind: str, changed: Sequence[Condition]
) -> None:
    """A changed `QuotaReserved` as a Normal Event on the workload (a rejected job's Warning Event was
    written when it was refused)."""
    if item.view.state is JobState.REJECTED:
        return
    for cond in changed:
        if cond.type == QUOTA_RESERVED:
            await cluster.event(item.namespace, name, "Normal", cond.reason, cond.message, kind)
