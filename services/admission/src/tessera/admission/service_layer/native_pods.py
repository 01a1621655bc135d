"""Users' gated Pods become Tessera jobs, and a deleted pod cancels its job.

As for labelled Jobs (`service_layer.native_jobs`), level-triggered: each round lists the pods
labelled `tessera.io/queue` that the webhook gave a job id, submits those admission does not know
yet under that id (a restart adopts nothing twice), and cancels the jobs whose pod is gone, which
frees their quota (gone: recorded before this round's listing was taken and not in it, as for Jobs;
a pod that ran may be reported ended by the scheduler first: its job then failed, and its quota is
free as well). Admission's workload sync then removes a pod's scheduling gate when its job is
admitted, and deletes the pod when its job is preempted (its ReplicaSet or StatefulSet makes it
again, gated, and it queues again).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from tessera.admission.domain.model import FINAL
from tessera.admission.domain.native import KubePriorities
from tessera.admission.domain.native_pods import native_pod
from tessera.admission.domain.workload_sync import Applied, Owner
from tessera.admission.service_layer.handlers import cancel_job, submit_job
from tessera.admission.service_layer.native_jobs import known_user_owned
from tessera.admission.service_layer.ports import WorkloadCluster
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork

log = logging.getLogger(__name__)
POD = "Pod"


async def adopt_native_pods(uow: Callable[[], AdmissionUnitOfWork], cluster: WorkloadCluster) -> int:
    """One round; returns how many jobs it submitted or cancelled."""
    known = await known_user_owned(uow, POD)  # before the listing (`native_jobs.known_user_owned`)
    listed = [(item, found) for item in await cluster.labelled_pods() if (found := native_pod(item))]
    priorities: KubePriorities | None = None
    changed = 0
    for item, found in listed:
        async with uow() as work:
            if await work.jobs.get(found.job_id) is not None:
                continue
            if priorities is None:  # read once a round, and only when there is a pod to adopt
                priorities = KubePriorities.of(await cluster.priority_classes())
            found = native_pod(item, priorities) or found
            result = await submit_job(
                found.spec, work, found.job_id, templates_required=True, shared_namespace=False
            )
            note = "; ".join(f"{e.field}: {e.reason}" for e in result.errors)
            objects = [(POD, found.name)]
            await work.workloads.record(
                found.job_id, found.namespace, objects, Applied.SUSPENDED, datetime.now(UTC), note, Owner.USER
            )
            await work.commit()
        if result.errors:  # say why on the pod, where `kubectl describe pod` shows it
            unknown = any(e.field == "queue" and "unknown" in e.reason for e in result.errors)
            reason = "QueueNotFound" if unknown else "Inadmissible"
            await cluster.event(found.namespace, found.name, "Warning", reason, f"Inadmissible: {note}", POD)
        else:
            message = f"queued as Tessera job {found.job_id}: gated until admitted"
            await cluster.event(found.namespace, found.name, "Normal", "Queued", message, POD)
        log.info(
            "adopted pod %s/%s: %s", found.namespace, found.name, result.state, extra={"job_id": found.job_id}
        )
        changed += 1
    present = {found.job_id for _, found in listed}
    gone = [row for row in known if row[0] not in present]
    for job_id, namespace, name in gone:
        async with uow() as work:
            job = await work.jobs.get(job_id, for_update=True)  # the scheduler may end it meanwhile
            if job is not None and job.state not in FINAL:
                await cancel_job(job_id, work, f"its pod {namespace}/{name} was deleted")
            await work.workloads.record(
                job_id, namespace, [(POD, name)], Applied.DELETED, datetime.now(UTC), "deleted", Owner.USER
            )
            await work.commit()
        changed += 1
    return changed
