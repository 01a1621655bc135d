"""Jobs become Kubernetes objects, and their states become the objects' states.

Level-triggered, as a controller: each round reads the jobs whose objects differ from what their
state wants (`uow.workloads.due`), changes the cluster, then records what it made sure of. The
cluster calls are idempotent and a Job is unsuspended only when the API shows it suspended, so a
round cut short by a crash repeats safely: nothing is created twice and nothing unsuspended twice,
and the Event telling of each change (admitted, preempted) is told once, by the round that finds
it made if the one that made it died first (`_told_always`).

A change the cluster refuses (`WorkloadError`) is tried again in later rounds, after the other due
jobs: the due jobs come oldest change first and a refused one records nothing, so without that the
same hundred refused jobs (a namespace that does not exist, a forbidden one) would take every round.
Admission's own Jobs found gone when a round comes to (un)suspend them are made again by that round.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from tessera.admission.domain.flavor_placement import FlavorPlacement, placement_of
from tessera.admission.domain.kube_objects import job_objects
from tessera.admission.domain.queueing import FlavorSpec
from tessera.admission.domain.workload_sync import Applied, Owner, WorkloadDue
from tessera.admission.service_layer.ports import WorkloadCluster, WorkloadError, WorkloadGone
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    namespace: str
    objects: tuple[tuple[str, str], ...]
    applied: Applied
    note: str = ""


async def apply(
    item: WorkloadDue,
    cluster: WorkloadCluster,
    namespace: str,
    flavors: Mapping[str, FlavorSpec] | None = None,
) -> Outcome:
    """Make the cluster what ``item`` wants; raises `WorkloadError` when the cluster fails. Jobs it
    unsuspends go to the nodes of their pod group's flavor (described in ``flavors``, by name)."""
    where = item.namespace or namespace
    if item.want is Applied.DELETED:
        await cluster.delete(where, item.objects)
        return Outcome(where, item.objects, Applied.DELETED)
    objects = item.objects
    if item.applied is None:
        if item.spec is None:
            return Outcome(where, (), Applied.UNRUNNABLE, "no job spec")
        try:
            made = job_objects(item.job_id, item.spec, where)
        except ValueError as error:
            return Outcome(where, (), Applied.UNRUNNABLE, str(error))
        await cluster.create(made)  # suspended
        objects = tuple((ref.kind, ref.name) for ref in made.refs)
    pods = [name for kind, name in objects if kind == "Pod"]
    if pods:
        placement = placement_of(item.flavors[0], flavors or {}) if item.flavors else None
        return await _apply_pods(item, cluster, where, pods, placement)
    jobsets = [name for kind, name in objects if kind == "JobSet"]
    if jobsets:
        return await _apply_jobset(item, cluster, where, jobsets[0], flavors or {})
    jobs = [name for kind, name in objects if kind == "Job"]
    placements = _placements(item, jobs, flavors)
    try:
        changed = await cluster.set_suspended(where, jobs, item.want is Applied.SUSPENDED, placements)
    except WorkloadGone as gone:
        if item.owner is Owner.USER:  # its owner deleted it: nothing left to hold or release
            return Outcome(where, objects, Applied.DELETED, str(gone))
        if item.spec is None:
            raise
        # Admission made them (suspended, say while the job queued) and they were deleted behind its
        # back since: they are made again, suspended, as a first round makes them. Left refused, every
        # later round would find them gone, and reconciliation does not make again objects that were
        # never unsuspended: the job would hold its quota and never run.
        log.warning("job objects made again: %s", gone, extra={"job_id": item.job_id})
        made = job_objects(item.job_id, item.spec, where)
        await cluster.create(made)
        objects = tuple((ref.kind, ref.name) for ref in made.refs)
        jobs = [name for kind, name in objects if kind == "Job"]
        placements = _placements(item, jobs, flavors)
        changed = await cluster.set_suspended(where, jobs, item.want is Applied.SUSPENDED, placements)
    verb = "suspended" if item.want is Applied.SUSPENDED else "unsuspended"
    for name in [n for n in jobs if n in changed or _told_always(item)]:
        # Say why on the Job, where `kubectl describe job` shows it.
        if item.want is Applied.RUNNING:
            flavor = f" in flavor {placements[name].flavor}" if name in placements else ""
            message = f"admitted by Tessera ({item.state}){flavor}: unsuspended"
            await cluster.event(
                where, name, "Normal", "Admitted", message, name=item.event_name(name, "Admitted")
            )
        else:
            message = f"job {item.state}: suspended until admitted again"
            await cluster.event(
                where, name, "Normal", "Preempted", message, name=item.event_name(name, "Preempted")
            )
    return Outcome(where, objects, item.want, f"{verb} {', '.join(changed)}" if changed else "")


def _placements(
    item: WorkloadDue, jobs: list[str], flavors: Mapping[str, FlavorSpec] | None
) -> dict[str, FlavorPlacement]:
    """Each Job's nodes: those of its pod group's flavor (the Jobs and flavors in pod group order)."""
    return {
        name: placement_of(flavor, flavors or {}) for name, flavor in zip(jobs, item.flavors, strict=False)
    }


def _told_always(item: WorkloadDue) -> bool:
    """Whether each object's Event is told whether or not this round changed it: for an admission,
    and for a suspension of objects that ran. A round cut short after it changed the cluster, before
    it told of it, leaves the change for this one to find made already; the Event's name is the
    change's (`WorkloadDue.event_name`), so it is told once however many rounds tell it."""
    return item.want is Applied.RUNNING or item.applied is Applied.RUNNING


async def _apply_pods(
    item: WorkloadDue,
    cluster: WorkloadCluster,
    where: str,
    pods: list[str],
    placement: FlavorPlacement | None = None,
) -> Outcome:
    """A user's gated pod: admitted, its scheduling gate goes and it is put on its flavor's nodes
    (the flavor's node labels added to its nodeSelector, its tolerations added); preempted after it
    was released, it is deleted (its ReplicaSet or StatefulSet makes it again, gated, and it queues
    again). A pod found gone is left to the pod adoption, which cancels its job."""
    objects = tuple(("Pod", name) for name in pods)
    if item.want is Applied.RUNNING:
        try:
            changed = await cluster.release_pods(where, pods, placement)
        except WorkloadGone as gone:
            return Outcome(where, objects, item.want, str(gone))
        flavor = f" in flavor {placement.flavor}" if placement is not None else ""
        for name in pods:  # those released in a round cut short too (`_told_always`)
            message = f"admitted by Tessera ({item.state}){flavor}: scheduling gate removed"
            await cluster.event(
                where, name, "Normal", "Admitted", message, "Pod", item.event_name(name, "Admitted")
            )
        return Outcome(where, objects, item.want, f"released {', '.join(changed)}" if changed else "")
    if item.applied is Applied.RUNNING:
        for name in pods:
            message = f"job {item.state}: pod deleted, its controller makes it again gated"
            await cluster.event(
                where, name, "Normal", "Preempted", message, "Pod", item.event_name(name, "Preempted")
            )
        await cluster.delete(where, objects)
        return Outcome(where, objects, item.want, f"deleted {', '.join(pods)}")
    return Outcome(where, objects, item.want)


async def _apply_jobset(
    item: WorkloadDue, cluster: WorkloadCluster, where: str, name: str, flavors: Mapping[str, FlavorSpec]
) -> Outcome:
    """A user's JobSet, one gang: unsuspended when admitted (each replicated job on its pod group's
    flavor), suspended again when preempted; its controller suspends and resumes its child Jobs."""
    objects = (("JobSet", name),)
    placements = [placement_of(flavor, flavors) for flavor in item.flavors]
    try:
        changed = await cluster.set_jobset_suspended(where, name, item.want is Applied.SUSPENDED, placements)
    except WorkloadGone as gone:  # its owner deleted it: nothing left to hold or release
        return Outcome(where, objects, Applied.DELETED, str(gone))
    if not changed and not _told_always(item):
        return Outcome(where, objects, item.want)
    if item.want is Applied.RUNNING:
        message = f"admitted by Tessera ({item.state}) as one gang: unsuspended"
        await cluster.event(
            where, name, "Normal", "Admitted", message, "JobSet", item.event_name(name, "Admitted")
        )
        return Outcome(where, objects, item.want, f"unsuspended {name}" if changed else "")
    message = f"job {item.state}: suspended until admitted again"
    await cluster.event(
        where, name, "Normal", "Preempted", message, "JobSet", item.event_name(name, "Preempted")
    )
    return Outcome(where, objects, item.want, f"suspended {name}" if changed else "")


async def sync_workloads(
    uow: Callable[[], AdmissionUnitOfWork],
    cluster: WorkloadCluster,
    namespace: str,
    limit: int = 100,
    refused: set[str] | None = None,
) -> int:
    """One round; returns how many jobs' objects it brought to their state. ``refused``, the jobs the
    cluster refused last time they were tried (kept by the caller from round to round, and updated
    here), go after the others: the round reads as many more due jobs as there are refused ones and
    tries the others first."""
    refused = set() if refused is None else refused
    async with uow() as work:
        read = await work.workloads.due(limit + len(refused))
        due = sorted(read, key=lambda item: item.job_id in refused)[:limit]  # stable: oldest first
        refused.intersection_update(item.job_id for item in read)  # those no longer due are done with
        flavors = {}
        if any(item.want is Applied.RUNNING and item.flavors for item in due):
            flavors = {f.name: f.to_domain() for f in (await work.config.load()).flavors}
    done = 0
    for item in due:
        try:
            outcome = await apply(item, cluster, namespace, flavors)
        except WorkloadError as error:
            log.warning("job objects not changed: %s", error, extra={"job_id": item.job_id})
            refused.add(item.job_id)
            continue
        refused.discard(item.job_id)
        async with uow() as work:
            await work.workloads.record(
                item.job_id,
                outcome.namespace,
                outcome.objects,
                outcome.applied,
                datetime.now(UTC),
                outcome.note,
                item.owner,
            )
            await work.commit()
        log.info("job objects %s", outcome.applied, extra={"job_id": item.job_id, "note": outcome.note})
        done += 1
    return done
