"""The groups of users' LeaderWorkerSets become Tessera jobs; each is released whole, or not at all.

Level-triggered, as the other adoptions (`service_layer.native_pods`): each round lists the gated
pods of LeaderWorkerSets and the LeaderWorkerSets, and for each group (`domain.native_lws`):
- not known yet and complete (its leader and all its workers exist): submitted as one job, under an
  id derived from the group, so a restart submits nothing twice;
- its job holds quota (admitted, placed, running): every pod of the group gets the job's id and its
  pod group as labels and loses its scheduling gate in one patch, so the scheduler sees the whole
  group as the job's gang only after quota for all of it is reserved. A pod the StatefulSets make
  later (a worker made again) is released the same way in a later round;
- its job is back in its queue (preempted) while its pods were released: the group's pods are
  deleted; the LeaderWorkerSet makes the group again, gated, and the new group queues as a new job.

A job whose group is gone (the LeaderWorkerSet deleted or scaled down, or its leader made again) is
cancelled, which frees its quota (gone: recorded before this round's listing was taken and not in it,
as for Jobs; a group another replica submitted meanwhile may be newer than the listing). The workload
sync records these jobs' states; it has no object of theirs to change (`Applied` follows the state,
the pods are this round's).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from tessera.admission.domain.model import FINAL, HOLDS_QUOTA, JobState
from tessera.admission.domain.native import KubePriorities
from tessera.admission.domain.native_lws import (
    LwsGroup,
    complete,
    group_event_name,
    group_job,
    group_job_id,
    groups_of,
    member_labels,
)
from tessera.admission.domain.native_pods import gated
from tessera.admission.domain.workload_sync import Applied, Owner
from tessera.admission.service_layer.handlers import cancel_job, submit_job
from tessera.admission.service_layer.native_jobs import known_user_owned
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork

log = logging.getLogger(__name__)
LWS = "LeaderWorkerSet"
_WAITING = frozenset({JobState.QUEUED, JobState.PREEMPTED})


@runtime_checkable
class LwsCluster(Protocol):
    """What this needs of the cluster (`adapters.kube.KubeWorkloads` has it)."""

    async def lws_pods(self) -> list[dict[str, Any]]: ...
    async def leaderworkersets(self) -> list[dict[str, Any]]: ...
    async def label_pods(
        self, namespace: str, labels: Mapping[str, Mapping[str, str]], release: bool
    ) -> list[str]: ...
    async def priority_classes(self) -> list[dict[str, Any]]: ...
    async def delete(self, namespace: str, objects: Sequence[tuple[str, str]]) -> None: ...
    async def event(
        self,
        namespace: str,
        job: str,
        kind: str,
        reason: str,
        message: str,
        involved: str = "Job",
        name: str | None = None,
    ) -> None: ...


async def sync_lws_groups(uow: Callable[[], AdmissionUnitOfWork], cluster: LwsCluster) -> int:
    """One round; returns how many groups it submitted, released, deleted or cancelled."""
    known = await known_user_owned(uow, LWS)  # before the listing (`native_jobs.known_user_owned`)
    pods = await cluster.lws_pods()
    by_name = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
    groups = groups_of(pods)
    sets: dict[tuple[str, str], dict[str, Any]] = {}
    if groups:
        for lws in await cluster.leaderworkersets():
            meta = lws["metadata"]
            if not meta.get("deletionTimestamp"):
                sets[(meta["namespace"], meta["name"])] = lws
    present: dict[str, tuple[LwsGroup, dict[str, Any]]] = {}
    for group in groups:
        owner = sets.get((group.namespace, group.lws))
        if owner is not None:
            present[group_job_id(owner, group)] = (group, owner)
    changed = 0
    priorities: KubePriorities | None = None
    for job_id, (group, lws) in present.items():
        async with uow() as work:
            job = await work.jobs.get(job_id)
            state = job.state if job is not None else None
            if job is not None and job.state is JobState.QUEUED and job.waiting:
                since = job.history[-1].at if job.history else job.submitted_at
                changed += await _say_why(work, cluster, group, job_id, job.waiting, since)
            if job is None and complete(lws, group):
                if priorities is None:  # read once a round, and only when there is a group to submit
                    priorities = KubePriorities.of(await cluster.priority_classes())
                found = group_job(lws, group, priorities)
                result = await submit_job(
                    found.spec, work, job_id, templates_required=True, shared_namespace=False
                )
                note = "; ".join(f"{e.field}: {e.reason}" for e in result.errors)
                objects = [(LWS, group.lws)]
                now = datetime.now(UTC)
                await work.workloads.record(
                    job_id, group.namespace, objects, Applied.SUSPENDED, now, note, Owner.USER
                )
                await work.commit()
                await _queued(cluster, group, job_id, note, result.errors)
                changed += 1
                continue
        if state in HOLDS_QUOTA:
            uids = {p: str(by_name[(group.namespace, p)]["metadata"].get("uid", "")) for p, _ in group.pods}
            changed += await _release(cluster, group, job_id, state, uids)
        elif state in _WAITING and any(not gated(by_name[(group.namespace, p)]) for p, _ in group.pods):
            changed += await _delete_group(cluster, group, job_id, state)
    return changed + await _cancel_gone(uow, [row for row in known if row[0] not in present])


async def _queued(
    cluster: LwsCluster, group: LwsGroup, job_id: str, note: str, errors: Sequence[Any]
) -> None:
    """Say on the LeaderWorkerSet, where `kubectl describe` shows it, how the group was queued."""
    where = f"group {group.index} ({group.size()} pods)"
    if errors:
        unknown = any(e.field == "queue" and "unknown" in e.reason for e in errors)
        reason = "QueueNotFound" if unknown else "Inadmissible"
        message = f"{where} inadmissible: {note}"
        name = group_event_name(group, job_id, reason)
        await cluster.event(group.namespace, group.lws, "Warning", reason, message, LWS, name)
    else:
        message = f"{where} queued as Tessera job {job_id}: gated until admitted whole"
        name = group_event_name(group, job_id, "Queued")
        await cluster.event(group.namespace, group.lws, "Normal", "Queued", message, LWS, name)
    log.info("adopted LeaderWorkerSet %s/%s %s", group.namespace, group.lws, where, extra={"job_id": job_id})


async def _say_why(
    work: AdmissionUnitOfWork,
    cluster: LwsCluster,
    group: LwsGroup,
    job_id: str,
    waiting: tuple[str, str],
    since: datetime,
) -> int:
    """An Event on the LeaderWorkerSet with the reason its group waits, once per reason (the last one
    said is the note of the job's workload record). Its name is made from the change and the time the
    job's record last changed (`since`): told again after a crash it is the same Event, and a reason
    told before and given again later (A, B, A, B) is another one."""
    record = await work.workloads.of_job(job_id)
    message = f"group {group.index} waits: {waiting[0]}: {waiting[1]}"
    if record is None or record[3] == message:
        return 0
    namespace, objects, applied, said = record
    await work.workloads.record(job_id, namespace, objects, applied, datetime.now(UTC), message, Owner.USER)
    await work.commit()
    name = group_event_name(group, job_id, waiting[0], said, message, since.isoformat())
    await cluster.event(group.namespace, group.lws, "Normal", waiting[0], message, LWS, name)
    return 0


async def _release(
    cluster: LwsCluster, group: LwsGroup, job_id: str, state: JobState | None, uids: Mapping[str, str]
) -> int:
    """Release the group's pods; ``uids``: each pod's uid as listed (a worker made again has the
    name of the one before it, and its release is another change, told by another Event)."""
    labels = {pod: member_labels(job_id, pod_group) for pod, pod_group in group.pods}
    released = await cluster.label_pods(group.namespace, labels, release=True)
    if not released:
        return 0
    message = (
        f"group {group.index} admitted by Tessera ({state}) as one gang: scheduling gates removed "
        f"from {', '.join(released)}"
    )
    name = group_event_name(group, job_id, "Admitted", *sorted(uids.get(p, p) for p in released))
    await cluster.event(group.namespace, group.lws, "Normal", "Admitted", message, LWS, name)
    return 1


async def _delete_group(cluster: LwsCluster, group: LwsGroup, job_id: str, state: JobState | None) -> int:
    """Tell, then delete the released group's pods; a round cut short between the two tells it again
    in the next round, under the same name (one Event: its job's pods are deleted once)."""
    message = f"group {group.index}: job {state}: its pods deleted; the group is made again, gated"
    name = group_event_name(group, job_id, "Preempted")
    await cluster.event(group.namespace, group.lws, "Normal", "Preempted", message, LWS, name)
    await cluster.delete(group.namespace, [("Pod", pod) for pod, _ in group.pods])
    return 1


async def _cancel_gone(uow: Callable[[], AdmissionUnitOfWork], gone: Sequence[tuple[str, str, str]]) -> int:
    for job_id, namespace, name in gone:
        async with uow() as work:
            job = await work.jobs.get(job_id, for_update=True)  # the scheduler may end it meanwhile
            if job is not None and job.state not in FINAL:
                await cancel_job(job_id, work, f"its group of LeaderWorkerSet {namespace}/{name} is gone")
            await work.workloads.record(
                job_id, namespace, [(LWS, name)], Applied.DELETED, datetime.now(UTC), "deleted", Owner.USER
            )
            await work.commit()
    return len(gone)
