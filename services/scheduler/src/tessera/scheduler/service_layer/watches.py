"""Cluster changes into the scheduler: nodes, pods (new gang members, pods that ended) and PodGroups.

Pods with ``schedulerName: tessera`` and the pod-group label, with their PodGroup, are gangs of
their own ("native" gangs, named ``<namespace>/<group>``). The pods of admitted jobs carry the
job-id label: their workloads' controllers create them, and each one that comes or goes resubmits
its job's gang with the members seen so far (:meth:`WatchState.refresh_job`). A pod that carries a
job's id outside the namespaces where that job's pods live is no member (:func:`admitted_members`).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from tessera.cluster.cache import pod_key
from tessera.cluster.conventions.names import SCHEDULER_NAME
from tessera.cluster.domain import GpuRequest, GpuRequestKind, Node, Pod, PodGroup
from tessera.cluster.port import EventType, WatchEvent
from tessera.contracts.jobs import JobSpec
from tessera.core.observability.ratelimit import RateLimitedLog
from tessera.scheduler.adapters.cluster_side import ClusterSide
from tessera.scheduler.adapters.kube import JOB_ID_LABEL
from tessera.scheduler.adapters.repository import JOB, PODGROUP, SchedulerRepository
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.domain.cache import CacheConflict, PodState, SchedulerCache
from tessera.scheduler.domain.framework.cluster_view import gang_spec, node_info
from tessera.scheduler.domain.framework.pod import InvalidSpec
from tessera.scheduler.domain.gang.queue import ClusterEvent
from tessera.scheduler.domain.gang.scheduler import GangOutcome
from tessera.scheduler.domain.gang.spec import GangSpec
from tessera.scheduler.domain.snapshot import Allocation, NodeInfo
from tessera.scheduler.service_layer.engine_state import EngineState
from tessera.scheduler.service_layer.gangs import (
    job_gang_of_pods,
    job_members,
    job_namespaces,
    job_strangers,
    member_group,
)
from tessera.scheduler.service_layer.outcomes import GangInfo

FOREIGN = "foreign:"  # gang name prefix of pods other schedulers placed

log = logging.getLogger(__name__)
_strangers = RateLimitedLog(log, interval_s=math.inf)  # once per pod (the newest 1024 pods)


def admitted_members(pods: Iterable[Pod], job_id: str, spec: JobSpec, jobs_namespace: str) -> list[Pod]:
    """An admitted job's members among ``pods`` (:func:`~.gangs.job_members`); a pod that carries its
    id from another namespace is left out, and logged once."""
    pods = list(pods)
    namespaces = job_namespaces(spec, jobs_namespace)
    for pod in job_strangers(pods, job_id, namespaces):
        key = pod_key(pod)
        _strangers.log(
            logging.WARNING,
            f"{key}/{pod.uid}",
            "a pod carries an admitted job's id outside the job's namespaces: it is no member",
            extra={"pod": key, "job_id": job_id, "namespaces": sorted(namespaces)},
        )
    return job_members(pods, job_id, namespaces)


def _ours(pod: Pod) -> bool:
    """A live, ungated pod for this scheduler that no admitted job owns (those are the job's gang)."""
    return (
        pod.scheduler_name == SCHEDULER_NAME
        and not pod.terminated
        and not pod.deleting
        and JOB_ID_LABEL not in pod.labels
        and pod.problem is None
        and not pod.gated
    )


def native_members(pods: Mapping[str, Pod], group: PodGroup) -> list[Pod]:
    """The live pods of a PodGroup that are ours to schedule."""
    return [
        pod
        for pod in pods.values()
        if pod.namespace == group.namespace and pod.pod_group == group.name and _ours(pod)
    ]


def native_of(
    pods: Mapping[str, Pod], groups: Mapping[str, PodGroup], key: str
) -> tuple[PodGroup, list[Pod]] | None:
    """The gang named ``key``: a PodGroup and its members, or a lone pod (a gang of one)."""
    group = groups.get(key)
    if group is not None:
        return group, native_members(pods, group)
    pod = pods.get(key)
    if pod is not None and not pod.pod_group and _ours(pod):
        return PodGroup(pod.namespace, pod.name, 1), [pod]
    return None


def foreign_allocation(pod: Pod, uuids: Mapping[int, str]) -> Allocation:
    """What a pod of another scheduler holds: CPU and memory, the GPUs its assignment names, and its
    MIG devices.

    GPUs handed out by the device plugin without Tessera's annotation cannot be told apart, so only
    annotated ones are counted. MIG devices are counted by profile, as the node advertises them:
    the slices its assignment names, else those its request asks for (``nvidia.com/mig-<profile>``)."""
    index_of = {uuid: index for index, uuid in uuids.items()}
    shares = pod.assignment.shares if pod.assignment is not None else ()
    gpus = tuple((index_of[s.gpu_uuid], s.milli) for s in shares if s.gpu_uuid in index_of and s.mig is None)
    mig: dict[str, int] = {}
    for share in shares:
        if share.mig is not None:
            mig[share.mig.profile] = mig.get(share.mig.profile, 0) + 1
    request = pod.requirements.gpu
    if not mig and request.kind is GpuRequestKind.MIG and request.mig_profile and request.count > 0:
        mig[request.mig_profile] = request.count
    key = pod_key(pod)
    return Allocation(
        key,
        f"{FOREIGN}{key}",
        pod.node_name or "",
        gpus,
        pod.requirements.cpu_milli,
        pod.requirements.memory_mib,
        tuple(sorted(mig.items())),
    )


def hold_foreign(cache: SchedulerCache, allocation: Allocation) -> None:
    """Count a pod another scheduler placed as bound; best effort: GPUs or MIG devices the cache
    cannot fit (the node does not advertise them just now, say while its device plugin restarts) are
    left out, but its CPU and memory are still counted; a pod whose CPU and memory do not fit either
    (the node is already full in our books) is left out rather than failing the cycle."""
    try:
        cache.assume(allocation)
    except CacheConflict:
        if not (allocation.gpu_milli or allocation.mig):
            return
        allocation = replace(allocation, gpu_milli=(), mig=())
        try:
            cache.assume(allocation)
        except CacheConflict:
            return
    with contextlib.suppress(CacheConflict):
        cache.confirm_bound(allocation.pod)


def requested_gpus(request: GpuRequest, node: NodeInfo) -> tuple[tuple[int, int], ...]:
    """GPUs of ``node`` that a pod's whole or fractional GPU request takes when no assignment names
    them: idle GPUs for whole ones, else the first GPU the share fits, healthy ones and the lowest
    index first; fewer, or none, where the cache's books show too little free on the node."""
    gpus = sorted((gpu for gpu in node.gpus if not gpu.mig), key=lambda gpu: (not gpu.healthy, gpu.index))
    if request.kind is GpuRequestKind.WHOLE:
        idle = [gpu.index for gpu in gpus if gpu.fully_idle]
        return tuple((index, request.milli) for index in idle[: request.count])
    if request.kind is GpuRequestKind.FRACTIONAL:
        for gpu in gpus:
            if gpu.fits(request.milli):
                return ((gpu.index, request.milli),)
    return ()


def hold_bound_pod(cache: SchedulerCache, pod: Pod, uuids: Mapping[int, str]) -> None:
    """Count a bound pod the scheduler did not place as holding what it uses (:func:`hold_foreign`):
    a pod of another scheduler, or one of ours bound by someone else (by hand, or made with its
    ``nodeName`` set). Such a pod of ours holds the GPUs its assignment names or, with none written,
    GPUs its request takes (:func:`requested_gpus`)."""
    allocation = foreign_allocation(pod, uuids)
    if pod.scheduler_name == SCHEDULER_NAME and pod.assignment is None:
        with contextlib.suppress(KeyError):
            gpus = requested_gpus(pod.requirements.gpu, cache.node(allocation.node))
            allocation = replace(allocation, gpu_milli=gpus)
    hold_foreign(cache, allocation)


def held_by_others(cache: SchedulerCache, key: str) -> bool:
    """Whether the cache counts pod ``key`` as placed by someone else: no gang member, then."""
    allocation = cache.allocation(key)
    return allocation is not None and allocation.gang.startswith(FOREIGN)


def native_keys(pods: Mapping[str, Pod], groups: Mapping[str, PodGroup]) -> list[str]:
    """Every PodGroup, and every lone pod of ours still waiting for a node."""
    lone = [key for key, pod in pods.items() if not pod.pod_group and not pod.bound and _ours(pod)]
    return sorted(set(groups) | set(lone))


def native_gang(group: PodGroup, members: list[Pod], submitted_at: float) -> GangSpec:
    """A PodGroup as a gang; members are keyed ``namespace/name`` as every pod in the domain is."""
    spec = gang_spec(group, members, submitted_at)
    renamed = tuple(replace(pod, name=f"{group.namespace}/{pod.name}") for pod in spec.members)
    return replace(spec, members=renamed)


class WatchState:
    """Applies one watch event to the scheduler's state; returns the gangs it broke."""

    def __init__(
        self, state: EngineState, cluster: ClusterSide, settings: SchedulerSettings, now: float
    ) -> None:
        self.state = state
        self.cluster = cluster
        self.settings = settings
        self.now = now

    async def apply(self, repo: SchedulerRepository, kind: str, event: WatchEvent[Any]) -> list[GangOutcome]:
        if kind == "node":
            return self._node(event)
        if kind == "pod":
            return await self._pod(repo, event)
        if kind == "podgroup":
            group: PodGroup = event.object
            await self.refresh_native(repo, group.key)
        return []

    def _node(self, event: WatchEvent[Node]) -> list[GangOutcome]:
        node, scheduler = event.object, self.state.assembly.scheduler
        if event.type is EventType.DELETED:
            self.state.nodes.pop(node.name, None)
            return scheduler.node_lost(node.name, self.now)
        try:
            info = node_info(node)
        except InvalidSpec:
            return []
        self.state.uuids[node.name] = {gpu.index: gpu.uuid for gpu in node.gpus}
        before = self.state.nodes.get(node.name)
        if before == info:
            return []
        self.state.nodes[node.name] = info
        outcomes = scheduler.node_changed(info, self.now)
        if before is not None and before.mig_capacity != info.mig_capacity:
            # New slices (a MIG layout applied by slicing): wake the gangs waiting for a layout.
            scheduler.notify(ClusterEvent.LAYOUT_CHANGED, self.now)
        return outcomes

    async def _pod(self, repo: SchedulerRepository, event: WatchEvent[Pod]) -> list[GangOutcome]:
        pod = event.object
        key = pod_key(pod)
        ended = event.type is EventType.DELETED or pod.terminated
        cache = self.state.assembly.cache
        if (ended or pod.deleting) and cache.pod_state(key) is PodState.ASSUMED:
            # reserved while its gang waits for quorum, never bound: the gang forgets the reservation,
            # and the refresh below drops the member (a pod made again under its name joins afresh)
            self.state.assembly.scheduler.reservation_gone(key, self.now)
        elif ended and cache.allocation(key) is not None:
            self.pod_ended(key, pod.phase.value if event.type is not EventType.DELETED else "Deleted")
            return []
        if pod.bound and not ended and cache.allocation(key) is None and not self.count_foreign(pod):
            return []
        # unplaced, or a pod of ours bound by someone else: it leaves its gang (held as foreign)
        unplaced = not pod.bound or held_by_others(cache, key)
        job_id = pod.labels.get(JOB_ID_LABEL)
        if job_id and pod.scheduler_name == SCHEDULER_NAME and unplaced:
            self.refresh_job(job_id)  # a member came, or one not yet placed went
            return []
        # a pod of ours that came, or one not yet placed that went (deleted, or ended before a node)
        if unplaced and pod.scheduler_name == SCHEDULER_NAME and (ended or pod.deleting or _ours(pod)):
            await self.refresh_native(repo, f"{pod.namespace}/{pod.pod_group}" if pod.pod_group else key)
        return []

    def count_foreign(self, pod: Pod) -> bool:
        """A bound pod the cache does not hold holds node capacity the cache must see: one another
        scheduler bound (or a kubelet runs), or one of ours someone else bound (:func:`hold_bound_pod`).
        One of ours being deleted is one the scheduler let go (evicted, preempted): not counted again.
        True when a pod of ours was counted."""
        ours = pod.scheduler_name == SCHEDULER_NAME
        if pod.node_name not in self.state.nodes or (ours and pod.deleting):
            return False
        uuids = self.state.uuids.get(pod.node_name or "", {})
        hold_bound_pod(self.state.assembly.cache, pod, uuids)
        return ours and held_by_others(self.state.assembly.cache, pod_key(pod))

    def pod_ended(self, key: str, phase: str) -> None:
        """A placed pod ended or vanished: its resources are free; its gang may now be finished. A
        pod only reserved (its gang waits for quorum) was never placed: its gang forgets it."""
        if self.state.assembly.scheduler.reservation_gone(key, self.now) is not None:
            return
        allocation = self.state.assembly.cache.remove_pod(key)
        if allocation is None:
            return
        info = self.state.gangs.get(allocation.gang)
        if info is not None:
            info.placed[key] = phase
        self.state.assembly.scheduler.notify(ClusterEvent.CAPACITY_FREED, self.now)

    def refresh_job(self, job_id: str) -> None:
        """(Re)submit an admitted job's gang with its live pods, if any of them waits for a node."""
        state = self.state
        info, spec = state.gangs.get(job_id), state.specs.get(job_id)
        if info is None or info.source != JOB or spec is None:
            return  # not admitted (yet, or any more): its pods wait for admission
        members = [
            pod
            for pod in admitted_members(
                self.cluster.cache.pods.store.values(), job_id, spec, self.settings.namespace
            )
            if not held_by_others(state.assembly.cache, pod_key(pod))
        ]
        # members that went before a node was found leave the gang (kept if placed; the controller
        # makes a replacement, which joins as a new member)
        state.assembly.scheduler.members_gone(job_id, {pod_key(pod) for pod in members})
        if not any(not pod.bound for pod in members):
            return
        info.groups.update({pod_key(pod): member_group(pod) for pod in members})
        submitted = info.submitted_at if info.submitted_at is not None else self.now
        gang = job_gang_of_pods(job_id, spec, members, submitted, self.settings.gang.timeout_s)
        state.assembly.scheduler.submit(gang)

    async def refresh_native(self, repo: SchedulerRepository, group_key: str) -> None:
        """(Re)submit a native gang from the PodGroup (or lone pod) and its pending pods."""
        cache = self.cluster.cache
        found = native_of(cache.pods.store, cache.pod_groups.store, group_key)
        state = self.state
        if found is not None:
            held = state.assembly.cache
            found = found[0], [pod for pod in found[1] if not held_by_others(held, pod_key(pod))]
        # members deleted while they waited for a node leave the gang; a gang left with none is gone
        present = {pod_key(pod) for pod in found[1]} if found is not None else set()
        if state.assembly.scheduler.members_gone(group_key, present):
            state.gangs.pop(group_key, None)
            state.native_submitted.pop(group_key, None)
            await repo.remove_pending(group_key)
        if found is None:
            return
        group, members = found
        if not any(not pod.bound for pod in members):
            return
        if group_key not in state.gangs:
            submitted = self.now
            await repo.add_pending(
                group_key,
                None,
                datetime.fromtimestamp(submitted, UTC),
                source=PODGROUP,
                priority=max((pod.requirements.priority for pod in members), default=0),
            )
            state.gangs[group_key] = GangInfo(group_key, PODGROUP, {}, {})
            state.native_submitted[group_key] = submitted
        info = state.gangs[group_key]
        info.groups.update({pod_key(pod): group.name for pod in members})
        spec = native_gang(group, members, state.native_submitted.get(group_key, self.now))
        spec = replace(spec, timeout_s=spec.timeout_s or self.settings.gang.timeout_s)
        state.assembly.scheduler.submit(spec)
