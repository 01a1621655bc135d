"""Users' labelled Jobs and JobSets become Tessera jobs, and deleting one cancels its job.

Level-triggered like the workload sync: each round lists the labelled Jobs (the API is the record),
submits those admission does not know yet under the id the webhook gave them (a resubmission of a
known id changes nothing, so a restart adopts nothing twice), and cancels the jobs whose Job is gone,
which frees their quota. A Job is gone when its record was read before the listing was taken and the
listing lacks it: one recorded later may be missing only because it is newer than the listing (another
replica listed it and adopted it meanwhile). Admission's workload sync then unsuspends and suspends
them as their jobs' states say, as it does for the objects it made itself.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from tessera.admission.domain.model import FINAL
from tessera.admission.domain.native import KubePriorities, NativeJob, native_job
from tessera.admission.domain.native_jobsets import native_jobset
from tessera.admission.domain.workload_sync import Applied, Owner
from tessera.admission.service_layer.handlers import cancel_job, submit_job
from tessera.admission.service_layer.ports import WorkloadCluster
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork

log = logging.getLogger(__name__)


async def adopt_native_jobs(uow: Callable[[], AdmissionUnitOfWork], cluster: WorkloadCluster) -> int:
    """One round, of Jobs then JobSets; returns how many jobs it submitted or cancelled."""
    changed = await _adopt(uow, cluster, "Job", cluster.labelled_jobs, native_job)
    return changed + await _adopt(uow, cluster, "JobSet", cluster.labelled_jobsets, native_jobset)


async def known_user_owned(uow: Callable[[], AdmissionUnitOfWork], kind: str) -> list[tuple[str, str, str]]:
    """(job id, namespace, name) of the users' workloads of ``kind`` recorded so far and not known
    deleted. Read before the cluster is listed: each of them was listed (by some replica) before the
    listing that follows, so one this listing lacks is gone. One recorded after it may be missing from
    it only because it was created after it."""
    async with uow() as work:
        return await work.workloads.user_owned(kind)


async def _adopt(
    uow: Callable[[], AdmissionUnitOfWork],
    cluster: WorkloadCluster,
    kind: str,
    list_labelled: Callable[[], Awaitable[list[dict[str, Any]]]],
    to_native: Callable[[Mapping[str, Any], KubePriorities | None], NativeJob | None],
) -> int:
    known = await known_user_owned(uow, kind)
    labelled = await list_labelled()
    listed = [(item, found) for item in labelled if (found := to_native(item, None)) is not None]
    priorities: KubePriorities | None = None
    changed = 0
    for item, found in listed:
        async with uow() as work:
            if await work.jobs.get(found.job_id) is not None:
                continue
            if priorities is None:  # read once a round, and only when there is a Job to adopt
                priorities = KubePriorities.of(await cluster.priority_classes())
            found = to_native(item, priorities) or found
            result = await submit_job(
                found.spec, work, found.job_id, templates_required=True, shared_namespace=False
            )
            note = "; ".join(f"{e.field}: {e.reason}" for e in result.errors)
            now = datetime.now(UTC)
            objects = [(kind, found.name)]
            await work.workloads.record(
                found.job_id, found.namespace, objects, Applied.SUSPENDED, now, note, Owner.USER
            )
            await work.commit()
        if result.errors:  # say why on the Job, where `kubectl describe job` shows it
            unknown = any(e.field == "queue" and "unknown" in e.reason for e in result.errors)
            reason = "QueueNotFound" if unknown else "Inadmissible"
            await cluster.event(found.namespace, found.name, "Warning", reason, f"Inadmissible: {note}", kind)
        else:
            await cluster.event(
                found.namespace, found.name, "Normal", "Queued", f"queued as Tessera job {found.job_id}", kind
            )
        log.info(
            "adopted %s/%s: %s", found.namespace, found.name, result.state, extra={"job_id": found.job_id}
        )
        changed += 1
    present = {found.job_id for _, found in listed}
    gone = [row for row in known if row[0] not in present]
    for job_id, namespace, name in gone:
        async with uow() as work:
            job = await work.jobs.get(job_id, for_update=True)  # the scheduler may end it meanwhile
            if job is not None and job.state not in FINAL:  # every other state may be cancelled
                await cancel_job(job_id, work, f"its {kind} {namespace}/{name} was deleted")
            await work.workloads.record(
                job_id, namespace, [(kind, name)], Applied.DELETED, datetime.now(UTC), "deleted", Owner.USER
            )
            await work.commit()
        changed += 1
    return changed
