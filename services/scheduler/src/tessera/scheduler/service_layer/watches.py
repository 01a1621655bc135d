"""Cluster changes into the scheduler: nodes, pods (new gang members, pods that ended) and PodGroups.

Pods with ``schedulerName: tessera`` and the pod-group label, with their PodGroup, are gangs of
their own ("native" gangs, named ``<namespace>/<group>``). The pods of admitted jobs carry the
job-id label: their workloads' controllers create them, and each one that comes or goes resubmits
its job's gang with the members seen so far (:meth:`WatchState.refresh_job`). A pod that carries a
job's id outside the namespaces where that job's pods live is no member (:func:`admitted_members`).

A bound pod of ours the cache does not hold was bound by someone else (held as foreign, it leaves
its gang) unless it carries the assignment our own bind writes, naming its node
(:func:`~.bound_pods.our_bind`): a bind that timed out but landed, a member whose eviction after a
rollback was refused, a bind of an earlier leader landing late. Such a pod rejoins its live gang as
a placed member (:meth:`WatchState.adopt`) or, its gang gone, holds what it uses and is evicted
again (:meth:`WatchState.let_go`). A pod the scheduler asked to evict is no member of any gang
until it is seen going or its eviction is refused (:class:`~tessera.scheduler.adapters.kube.Evictions`):
the watch shows an accepted eviction only later.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from tessera.cluster.cache import pod_key
from tessera.cluster.conventions.names import SCHEDULER_NAME
from tessera.cluster.domain import Node, Pod, PodGroup
from tessera.cluster.port import EventType, WatchEvent
from tessera.contracts.jobs import JobSpec
from tessera.core.observability.ratelimit import RateLimitedLog
from tessera.scheduler.adapters.cluster_side import ClusterSide
from tessera.scheduler.adapters.kube import JOB_ID_LABEL
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.domain.cache import CacheConflict
from tessera.scheduler.domain.framework.cluster_view import gang_spec, node_info
from tessera.scheduler.domain.framework.pod import InvalidSpec
from tessera.scheduler.domain.gang.queue import ClusterEvent
from tessera.scheduler.domain.gang.scheduler import GangOutcome
from tessera.scheduler.domain.gang.spec import GangSpec
from tessera.scheduler.domain.snapshot import Allocation
from tessera.scheduler.service_layer.bound_pods import (
    FOREIGN,
    adoptable,
    bound_by_others,
    foreign_allocation,
    held_by_others,
    hold_bound_pod,
    hold_foreign,
    our_bind,
    requested_gpus,
)
from tessera.scheduler.service_layer.engine_state import EngineState
from tessera.scheduler.service_layer.gangs import (
    job_gang_of_pods,
    job_members,
    job_namespaces,
    job_strangers,
    member_group,
)
from tessera.scheduler.service_layer.outcomes import GangInfo
from tessera.scheduler.service_layer.repository_port import JOB, PODGROUP, SchedulerRepository

# re-exported: the rebuild and the tests take them from here
__all__ = [
    "FOREIGN",
    "WatchState",
    "admitted_members",
    "foreign_allocation",
    "hold_bound_pod",
    "hold_foreign",
    "native_gang",
    "native_keys",
    "native_of",
    "requested_gpus",
]

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


def native_key(pod: Pod) -> str:
    """The native gang a pod of ours is a member of: its PodGroup's, else its own (a lone pod)."""
    return f"{pod.namespace}/{pod.pod_group}" if pod.pod_group else pod_key(pod)


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
            return await self.refresh_native(repo, group.key)
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
        if event.type is EventType.DELETED:
            self.state.evictions.gone(pod)
        if ended or pod.deleting:
            self.state.held_without_gpus.discard(key)
        cache, scheduler = self.state.assembly.cache, self.state.assembly.scheduler
        held = cache.allocation(key)
        if (ended or pod.deleting) and scheduler.not_placed(key):
            # reserved while its gang waits for quorum (or adopted, not placed yet): the gang forgets
            # it, and the refresh below drops the member (a pod made again under its name joins afresh)
            scheduler.reservation_gone(key, self.now)
        elif ended and held is not None:
            self.pod_ended(key, pod.phase.value if event.type is not EventType.DELETED else "Deleted")
            return []
        elif pod.bound and held is not None and self._moved(pod, held) and scheduler.not_placed(key):
            # reserved while its gang waits, bound elsewhere meanwhile (by someone else, or by an
            # earlier leader): binding it at quorum would fail (and break the gang) for ever, or hold
            # GPUs it does not use; it is counted where it is instead
            scheduler.reservation_gone(key, self.now)
        ours = pod.scheduler_name == SCHEDULER_NAME
        # bound by our bind and held for no gang, as the pod is now (its event may be stale): the
        # refresh adopts it; one gone or going since is left to its later events
        current = self.cluster.cache.pods.store.get(key) if our_bind(pod) and not ended else None
        if current is not None and self.adoptable(current):
            outcomes = await self.refresh(repo, current) if self.live(current) else []
            if cache.allocation(key) is None:
                self.let_go(current)  # its gang is gone, or did not take it
            return outcomes
        if our_bind(pod) and not ended and cache.allocation(key) is None:
            return []
        if pod.bound and not ended and cache.allocation(key) is None and not self.count_foreign(pod):
            return []
        # unplaced, or a pod of ours bound by someone else (it leaves its gang, held as foreign); or
        # one we bound and let go, now gone (it leaves its gang too)
        unplaced = not pod.bound or held_by_others(cache, key)
        unplaced |= ended and our_bind(pod) and cache.allocation(key) is None
        # a pod of ours that came, or one not yet placed that went (deleted, or ended before a node)
        if unplaced and ours and (pod.labels.get(JOB_ID_LABEL) or ended or pod.deleting or _ours(pod)):
            return await self.refresh(repo, pod)
        return []

    def adoptable(self, pod: Pod) -> bool:
        """A pod to adopt (:func:`~.bound_pods.adoptable`) that the scheduler is not evicting: an
        eviction the API accepted shows on the watch only later, and the pod then dies."""
        return adoptable(self.state.assembly.cache, pod) and not self.state.evictions.pending(pod)

    def member(self, pod: Pod) -> bool:
        """Whether a pod of a gang's counts as its member: not bound by someone else, and not one
        the scheduler is evicting (it goes; its controller makes another)."""
        return not bound_by_others(self.state.assembly.cache, pod) and not self.state.evictions.pending(pod)

    def _moved(self, pod: Pod, held: Allocation) -> bool:
        """Whether a bound pod is not where the cache holds it: another node or, as our bind's
        assignment names them, other GPUs."""
        if held.node != pod.node_name:
            return True
        if not our_bind(pod):
            return False
        if pod_key(pod) in self.state.held_without_gpus and not (held.gpu_milli or held.mig):
            return False  # adopted without the GPUs its bind gave it (:meth:`adopt`): where it is
        used = foreign_allocation(pod, self.state.uuids.get(held.node, {})).gpu_milli
        return sorted(used) != sorted(held.gpu_milli)

    async def refresh(self, repo: SchedulerRepository, pod: Pod) -> list[GangOutcome]:
        """Refresh the gang a pod of ours is a member of: its job's, else its native gang."""
        job_id = pod.labels.get(JOB_ID_LABEL)
        if job_id:
            return self.refresh_job(job_id)
        return await self.refresh_native(repo, native_key(pod))

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

    def live(self, pod: Pod) -> bool:
        """Whether the gang a pod of ours is a member of is live: an admitted job's (the pod in one of
        its namespaces), or a PodGroup's or lone pod's the scheduler keeps."""
        job_id = pod.labels.get(JOB_ID_LABEL)
        if not job_id:
            return native_key(pod) in self.state.gangs
        info, spec = self.state.gangs.get(job_id), self.state.specs.get(job_id)
        return (
            info is not None
            and info.source == JOB
            and spec is not None
            and pod.namespace in job_namespaces(spec, self.settings.namespace)
        )

    def let_go(self, pod: Pod) -> None:
        """A pod bound by our bind whose gang is gone (finished, forgotten): it holds what it uses,
        in no gang's name (if the cache can fit it), and is evicted again, once per backoff
        (:meth:`evict_once`); it stays a member of no gang and of any gang it joins (:meth:`adopt`)."""
        cache, key = self.state.assembly.cache, pod_key(pod)
        if cache.allocation(key) is not None or pod.node_name not in self.state.nodes:
            return
        hold_bound_pod(cache, pod, self.state.uuids.get(pod.node_name or "", {}))
        self.evict_once(pod)

    def let_go_held(self) -> None:
        """After a rebuild (and the native gangs' refresh): a pod bound by our bind that the cache
        holds for no gang and whose gang is not live (a finished job's, an earlier leader's bind
        landing late) holds what it uses and is evicted, once per backoff (:meth:`evict_once`), as its
        events would have it (:meth:`let_go`)."""
        cache = self.state.assembly.cache
        for pod in list(self.cluster.cache.pods.store.values()):
            live = our_bind(pod) and not pod.terminated and not pod.deleting
            if live and held_by_others(cache, pod_key(pod)) and not self.live(pod):
                self.evict_once(pod)

    def retry_evictions(self) -> None:
        """Each cycle: a pod of no live gang whose eviction was refused is asked again once its
        backoff is over (:meth:`~tessera.scheduler.adapters.kube.Evictions.due`): one the cache holds
        has no event that would. A refused pod gone, or in a live gang now, is forgotten. One whose
        node left is kept until the pod is gone, checked again after the longest backoff (5 min:
        :meth:`~tessera.scheduler.adapters.kube.Evictions.defer`), not at every cycle: should the
        node come back while the pod runs, that check lets it go (:meth:`let_go`) and evicts it."""
        evictions, cache = self.state.evictions, self.state.assembly.cache
        for key, uid in evictions.due():
            pod = self.cluster.cache.pods.store.get(key)
            if pod is None or pod.uid != uid or pod.terminated or pod.deleting or not our_bind(pod):
                evictions.forget((key, uid))
            elif pod.node_name not in self.state.nodes:
                evictions.defer((key, uid))  # its node is gone: nothing to evict on until it is back
            elif self.live(pod) or not (cache.allocation(key) is None or held_by_others(cache, key)):
                evictions.forget((key, uid))  # in a live gang: not to evict
            elif cache.allocation(key) is None:
                self.let_go(pod)
            else:
                self.evict_once(pod)

    def evict_once(self, pod: Pod) -> None:
        """Evict a pod bound by our bind that belongs to no live gang, unless the scheduler already
        asked to evict it (the same uid) since it was last seen going and its eviction is pending or
        was refused within the backoff: one the cache could not hold comes here at each of its
        events, and a refused eviction is asked again after the backoff, not at each event."""
        if self.state.evictions.tried(pod):
            return
        key = pod_key(pod)
        log.warning("a pod bound by the scheduler belongs to no live gang: evicting it", extra={"pod": key})
        self.state.port.evict(foreign_allocation(pod, self.state.uuids.get(pod.node_name or "", {})))

    def adopt(self, gang: str, pods: Iterable[Pod]) -> list[GangOutcome]:
        """Members of a live gang bound by our bind and held for no gang: each holds what its
        assignment names, bound, as a placed member (:meth:`GangScheduler.adopt`); one whose GPUs
        the cache cannot fit holds its CPU and memory; one that fits not even so stays a member
        waiting for a node (binding it there again succeeds; elsewhere it fails)."""
        cache, scheduler = self.state.assembly.cache, self.state.assembly.scheduler
        outcomes: list[GangOutcome] = []
        for pod in pods:
            key = pod_key(pod)
            if held_by_others(cache, key):
                cache.remove_pod(key)  # held in its stead while its gang was not live
            own = replace(foreign_allocation(pod, self.state.uuids.get(pod.node_name or "", {})), gang=gang)
            for allocation in (own, replace(own, gpu_milli=(), mig=())):
                try:
                    outcome = scheduler.adopt(allocation, self.now)
                except CacheConflict:
                    continue
                log.info("a member found bound by the scheduler rejoins its gang", extra={"pod": key})
                if allocation is own:
                    self.state.held_without_gpus.discard(key)
                else:
                    self.state.held_without_gpus.add(key)
                outcomes += [outcome] if outcome is not None else []
                break
        return outcomes

    def pod_ended(self, key: str, phase: str) -> None:
        """A placed pod ended or vanished: its resources are free; its gang may now be finished. A
        pod only reserved (its gang waits for quorum) was never placed: its gang forgets it. One held
        in its gang's name but never placed (:attr:`EngineState.leaving_unrecorded`) frees what it
        holds; its end is not its gang's (that could finish a gang none of whose pods was placed)."""
        if self.state.assembly.scheduler.reservation_gone(key, self.now) is not None:
            return
        allocation = self.state.assembly.cache.remove_pod(key)
        unrecorded = key in self.state.leaving_unrecorded
        self.state.leaving_unrecorded.discard(key)
        if allocation is None:
            return
        info = self.state.gangs.get(allocation.gang)
        if info is not None and not unrecorded:
            info.placed[key] = phase
        self.state.assembly.scheduler.notify(ClusterEvent.CAPACITY_FREED, self.now)

    def refresh_job(self, job_id: str) -> list[GangOutcome]:
        """(Re)submit an admitted job's gang with its live pods, if any of them waits for a node or
        was bound by our bind though the cache holds it for no gang (it is adopted: :meth:`adopt`)."""
        state = self.state
        info, spec = state.gangs.get(job_id), state.specs.get(job_id)
        if info is None or info.source != JOB or spec is None:
            return []  # not admitted (yet, or any more): its pods wait for admission
        members = [
            pod
            for pod in admitted_members(
                self.cluster.cache.pods.store.values(), job_id, spec, self.settings.namespace
            )
            if self.member(pod)
        ]
        # members that went before a node was found leave the gang (kept if placed; the controller
        # makes a replacement, which joins as a new member)
        state.assembly.scheduler.members_gone(job_id, {pod_key(pod) for pod in members})
        found = [pod for pod in members if self.adoptable(pod)]
        if not found and not any(not pod.bound for pod in members):
            return []
        info.groups.update({pod_key(pod): member_group(pod) for pod in members})
        submitted = info.submitted_at if info.submitted_at is not None else self.now
        gang = job_gang_of_pods(job_id, spec, members, submitted, self.settings.gang.timeout_s)
        state.assembly.scheduler.submit(gang)
        return self.adopt(job_id, found)

    async def refresh_native(self, repo: SchedulerRepository, group_key: str) -> list[GangOutcome]:
        """(Re)submit a native gang from the PodGroup (or lone pod) and its pending pods; members
        bound by our bind that the cache holds for no gang are adopted (:meth:`adopt`)."""
        cache = self.cluster.cache
        found = native_of(cache.pods.store, cache.pod_groups.store, group_key)
        state = self.state
        if found is not None:
            found = found[0], [pod for pod in found[1] if self.member(pod)]
        # members deleted while they waited for a node leave the gang; a gang left with none is gone
        present = {pod_key(pod) for pod in found[1]} if found is not None else set()
        if state.assembly.scheduler.members_gone(group_key, present):
            state.gangs.pop(group_key, None)
            state.native_submitted.pop(group_key, None)
            await repo.remove_pending(group_key)
        if found is None:
            return []
        group, members = found
        mine = [pod for pod in members if self.adoptable(pod)]
        if not any(not pod.bound for pod in members) and not (mine and group_key in state.gangs):
            return []
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
        return self.adopt(group_key, mine)
