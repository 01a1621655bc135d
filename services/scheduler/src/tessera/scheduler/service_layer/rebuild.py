"""Rebuilding the scheduler's state at start (or after a failed cycle) from Postgres and the cluster.

Inventory mode: nodes from the stored inventory, allocations from the placements table. Cluster
mode: nodes and pods from the watches; the placements table plus any bound pod of ours the table
does not know yet (the scheduler stopped between a bind and its commit). Pending gangs come back
with their attempts and backoff; a gang found bound below its quorum is evicted and requeued, so
nothing stays held by a partial gang and nothing is bound twice.

The rebuild runs as named, timed steps: read nodes -> read pending gangs -> read placements ->
adopt cluster pods -> learn the typical workload -> assemble -> recover.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from tessera.cluster.cache import pod_key
from tessera.cluster.conventions.names import SCHEDULER_NAME
from tessera.cluster.domain import Pod
from tessera.contracts.jobs import JobSpec
from tessera.core.observability.tracing import tracer
from tessera.scheduler.adapters.cluster_side import ClusterSide
from tessera.scheduler.adapters.kube import JOB_ID_LABEL, ClusterBinder, Evictions, InventoryBinder
from tessera.scheduler.config import SchedulerSettings, WorkloadProfileSettings
from tessera.scheduler.domain.framework.cluster_view import node_info
from tessera.scheduler.domain.framework.pod import InvalidSpec
from tessera.scheduler.domain.gang.assembly import Assembly, assemble
from tessera.scheduler.domain.gang.queue import ALL_EVENTS, BackoffPolicy, RequeueReason
from tessera.scheduler.domain.gang.scheduler import GangOutcome, OutcomeKind
from tessera.scheduler.domain.gang.spec import GangSpec
from tessera.scheduler.domain.placement import TypicalPod
from tessera.scheduler.domain.placement.observed_workload import typical_workload
from tessera.scheduler.domain.plugins.fragmentation import FragmentationScore
from tessera.scheduler.domain.snapshot import Allocation, NodeInfo
from tessera.scheduler.service_layer.bound_pods import hold_foreign, our_bind
from tessera.scheduler.service_layer.engine_state import EngineState
from tessera.scheduler.service_layer.gangs import (
    inventory_node,
    inventory_uuids,
    job_gang,
    job_gang_of_pods,
    job_namespaces,
    job_pod_names,
    member_group,
)
from tessera.scheduler.service_layer.outcomes import GangInfo
from tessera.scheduler.service_layer.repository_port import JOB, PODGROUP, PendingGang, SchedulerRepository
from tessera.scheduler.service_layer.steps import TimedSteps
from tessera.scheduler.service_layer.tracing import TracedBinder
from tessera.scheduler.service_layer.watches import (
    admitted_members,
    hold_bound_pod,
    native_gang,
    native_of,
)

# ClusterSide is re-exported: it lives in adapters now, and the scheduling loop imports it from here.
__all__ = ["ClusterSide", "learn_typical_workload", "rebuild"]

log = logging.getLogger(__name__)

Uuids = dict[str, dict[int, str]]


@dataclass
class PendingGangs:
    """The stored pending gangs, and what the engine knows of each of those still live."""

    rows: list[PendingGang]
    gangs: dict[str, GangInfo] = field(default_factory=dict)
    specs: dict[str, JobSpec] = field(default_factory=dict)
    known: list[GangSpec] = field(default_factory=list)
    native_submitted: dict[str, float] = field(default_factory=dict)


async def rebuild(
    repo: SchedulerRepository, settings: SchedulerSettings, cluster: ClusterSide | None, now: float
) -> EngineState:
    """The engine's state from the database and, with ``cluster``, from the watches' cache."""
    steps = TimedSteps("scheduler.rebuild")
    with tracer().start_as_current_span("scheduler.rebuild"):
        with steps("read_nodes"):
            nodes, uuids, stamp = await read_nodes(repo, cluster)
        with steps("read_pending_gangs"):
            pending = await read_pending_gangs(repo, settings, cluster)
        with steps("read_placements"):
            bound, leaving, recorded = await read_placements(repo, cluster, nodes, pending.gangs)
        held: list[Pod] = []
        if cluster is not None:
            with steps("adopt_cluster_pods"):
                adopted, held, going = adopt_cluster_pods(
                    cluster, nodes, uuids, pending.gangs, recorded, pending.specs, settings.namespace
                )
                bound += adopted
                leaving += going
                no_members = {pod_key(pod) for pod in held} | {a.pod for a in leaving}
                pending.known = without_members(pending.known, no_members)
        with steps("learn_typical_workload"):
            typical = await learn_typical_workload(repo, settings.workload_profile)
        with steps("assemble"):
            port = binding_port(cluster, uuids, settings)
            fragmentation = fragmentation_score(typical, nodes.values())
            assembly = assemble_scheduler(nodes, port, settings, bound, pending.known, fragmentation)
            for allocation in leaving:
                hold_foreign(assembly.cache, allocation)  # in its gang's name, as no member of it
            for pod in held:
                hold_bound_pod(assembly.cache, pod, uuids.get(pod.node_name or "", {}))
        state = EngineState(
            assembly,
            pending.gangs,
            pending.specs,
            uuids,
            nodes,
            port,
            native_submitted=pending.native_submitted,
            inventory_stamp=stamp,
            fragmentation=fragmentation,
            workload_learnt_at=now,
            evictions=cluster.evictions if cluster is not None else Evictions(),
            leaving_unrecorded={a.pod for a in leaving if a.pod not in recorded},
        )
        with steps("recover"):
            state.recovered = recover_gangs(state, pending.rows, bound, recorded, now)
    steps.log(
        log,
        "scheduler state rebuilt",
        nodes=len(nodes),
        gangs=len(state.gangs),
        bound=len(bound),
        recovered=len(state.recovered),
    )
    return state


# -- steps ---------------------------------------------------------------------------------------


async def read_nodes(
    repo: SchedulerRepository, cluster: ClusterSide | None
) -> tuple[dict[str, NodeInfo], Uuids, tuple[int, datetime | None] | None]:
    """Nodes and their GPUs' UUIDs: the stored inventory (with its stamp), or the watched nodes."""
    nodes: dict[str, NodeInfo] = {}
    uuids: Uuids = {}
    if cluster is None:
        stamp = await repo.inventory_stamp()
        for inventory in await repo.inventory():
            nodes[inventory.name] = inventory_node(inventory)
            uuids[inventory.name] = inventory_uuids(inventory)
        return nodes, uuids, stamp
    for node in cluster.cache.nodes.store.values():
        with contextlib.suppress(InvalidSpec):
            nodes[node.name] = node_info(node)
            uuids[node.name] = {gpu.index: gpu.uuid for gpu in node.gpus}
    return nodes, uuids, None


async def read_pending_gangs(
    repo: SchedulerRepository, settings: SchedulerSettings, cluster: ClusterSide | None
) -> PendingGangs:
    """Admitted jobs still waiting, and native gangs whose pods still wait (others are forgotten).
    On a cluster a job's members are the pods its workloads created so far, in the namespaces where
    its pods live; a job none of whose pods exist yet is known, and joins the queue when they come."""
    pending = PendingGangs(await repo.pending())
    timeout = settings.gang.timeout_s
    for row in pending.rows:
        if row.source == JOB and row.spec is not None:
            submitted = row.submitted_at.timestamp()
            info = GangInfo(
                row.job_id, JOB, dict(row.trace), resume_from=row.resume_from, submitted_at=submitted
            )
            pending.gangs[row.job_id] = info
            pending.specs[row.job_id] = row.spec
            if cluster is None:
                names = job_pod_names(row.job_id, row.spec, settings.namespace)
                info.groups = {m.key: m.group for m in names}
                pending.known.append(job_gang(row.job_id, row.spec, settings.namespace, submitted, timeout))
                continue
            members = admitted_members(
                cluster.cache.pods.store.values(), row.job_id, row.spec, settings.namespace
            )
            info.groups = {pod_key(pod): member_group(pod) for pod in members}
            if members:
                pending.known.append(job_gang_of_pods(row.job_id, row.spec, members, submitted, timeout))
        elif row.source == PODGROUP and cluster is not None:
            found = native_of(cluster.cache.pods.store, cluster.cache.pod_groups.store, row.job_id)
            if found is None or not found[1]:
                await repo.remove_pending(row.job_id)
                continue
            group, live = found
            pending.gangs[row.job_id] = GangInfo(
                row.job_id, PODGROUP, {}, {pod_key(p): group.name for p in live}
            )
            pending.native_submitted[row.job_id] = row.submitted_at.timestamp()
            pending.known.append(native_gang(group, live, pending.native_submitted[row.job_id]))
    return pending


async def read_placements(
    repo: SchedulerRepository,
    cluster: ClusterSide | None,
    nodes: Mapping[str, NodeInfo],
    gangs: dict[str, GangInfo],
) -> tuple[list[Allocation], list[Allocation], set[str]]:
    """The recorded placements: (the allocations still held on known nodes, as bound members of
    their gangs; those of pods leaving; every recorded pod).

    Each joins its gang in ``gangs``; on a cluster, a pod that ended or vanished meanwhile is
    noted with its final phase and holds nothing. A pod being deleted is leaving: it holds what it
    was given until it is gone, in its gang's name (its end is counted then), but is no bound
    member of its gang and is adopted by none. A pod the scheduler is evicting (the outcome that
    let it go, and released its record, did not commit) is released now and is not recorded: it
    holds what it uses as one the scheduler is evicting (:func:`adopt_cluster_pods`), and rejoins
    a live gang only if its eviction is refused."""
    bound: list[Allocation] = []
    leaving: list[Allocation] = []
    recorded: set[str] = set()
    for placed in await repo.placements():
        live = cluster.cache.pods.store.get(placed.pod) if cluster is not None else None
        if cluster is not None and live is not None and cluster.evictions.pending(live):
            await repo.release_pod(placed.pod)
            continue
        info = gangs.setdefault(placed.job_id, GangInfo(placed.job_id, JOB))
        info.groups.setdefault(placed.pod, placed.pod_group)
        info.placed[placed.pod] = None
        recorded.add(placed.pod)
        if cluster is not None and (live is None or live.terminated):
            info.placed[placed.pod] = live.phase.value if live else "Deleted"
            continue
        if placed.node in nodes:
            allocation = Allocation(
                placed.pod, placed.job_id, placed.node, placed.gpus, placed.cpu_milli, placed.memory_mib
            )
            (leaving if live is not None and live.deleting else bound).append(allocation)
    return bound, leaving, recorded


def adopt_cluster_pods(
    cluster: ClusterSide,
    nodes: Mapping[str, NodeInfo],
    uuids: Uuids,
    gangs: Mapping[str, GangInfo],
    recorded: set[str],
    specs: Mapping[str, JobSpec],
    jobs_namespace: str,
) -> tuple[list[Allocation], list[Pod], list[Allocation]]:
    """What the cluster shows bound on known nodes that the table does not: (pods of our gangs bound
    before their placement was recorded, pods that hold capacity as someone else's placement, pods
    of our gangs bound so but being deleted).

    The first are members of a gang being rebuilt that our bind bound (:func:`~.bound_pods.our_bind`:
    the assignment names their node and their own uid, or no uid in the earlier format, so a copy
    naming another pod's uid adopts nothing); a pod with a job's id is a member only in the job's
    namespaces (:func:`~.gangs.job_namespaces`), as on the watches. The second are pods of other schedulers, and pods of ours that someone else
    bound (no member, or no assignment), and pods of ours the scheduler asked to evict that do not
    show going yet (:class:`~tessera.scheduler.adapters.kube.Evictions`). A pod being deleted still
    uses its GPUs until it is gone (its grace period): one our bind bound for a gang being rebuilt
    is the third kind, held in its gang's name as a recorded pod leaving is (:func:`read_placements`),
    but no member, and its end is not counted as a placed member's (it was never recorded); any other
    is held as someone else's. Neither is adopted; the cache frees each once, when it goes."""
    adopted: list[Allocation] = []
    held: list[Pod] = []
    leaving: list[Allocation] = []
    for pod in cluster.cache.pods.store.values():
        key = pod_key(pod)
        if not pod.bound or pod.terminated or pod.node_name not in nodes:
            continue
        if pod.scheduler_name != SCHEDULER_NAME:
            held.append(pod)
            continue
        if key in recorded:
            continue
        gang = _gang_of(pod, gangs, specs, jobs_namespace)
        own = gang if gang is not None and our_bind(pod) else None
        allocation = _cluster_allocation(pod, own, uuids.get(pod.node_name or "", {})) if own else None
        if pod.deleting and allocation is not None:
            leaving.append(allocation)
        elif allocation is not None and not pod.deleting and not cluster.evictions.pending(pod):
            adopted.append(allocation)
        else:
            held.append(pod)
    # those whose assignment names their GPUs first, so that GPUs taken by request avoid them
    return adopted, sorted(held, key=lambda pod: pod.assignment is None), leaving


def without_members(specs: Iterable[GangSpec], pods: Collection[str]) -> list[GangSpec]:
    """The gangs with ``pods`` (bound by someone else) left out of their members; a gang left with
    no member is left out (it joins again when a member of its comes)."""
    kept = [(spec, tuple(m for m in spec.members if m.name not in pods)) for spec in specs]
    return [
        spec if len(members) == len(spec.members) else replace(spec, members=members)
        for spec, members in kept
        if members
    ]


async def learn_typical_workload(
    repo: SchedulerRepository, profile: WorkloadProfileSettings
) -> tuple[TypicalPod, ...]:
    """The workload the fragmentation score expects, from the latest placements (see
    :mod:`~tessera.scheduler.domain.placement.observed_workload` for the cold-start rule)."""
    recent = await repo.recent_gpu_shapes(profile.sample_size)
    return typical_workload(recent, min_pods=profile.min_gpu_pods)


def binding_port(
    cluster: ClusterSide | None, uuids: Uuids, settings: SchedulerSettings
) -> InventoryBinder | ClusterBinder:
    """Binds on the cluster, or (inventory mode) only records."""
    if cluster is None:
        return InventoryBinder()
    loop = asyncio.get_running_loop()
    return ClusterBinder(
        cluster.cluster,
        loop,
        lambda node: uuids.get(node, {}),
        settings.bind_timeout_s,
        evictions=cluster.evictions,
    )


def fragmentation_score(
    typical: Iterable[TypicalPod], nodes: Iterable[NodeInfo]
) -> FragmentationScore | None:
    """FGD's score over the nodes' GPU models; none without a GPU to score."""
    models = sorted({gpu.model for node in nodes for gpu in node.gpus})
    return FragmentationScore(tuple(typical), models) if models else None


def assemble_scheduler(
    nodes: Mapping[str, NodeInfo],
    port: InventoryBinder | ClusterBinder,
    settings: SchedulerSettings,
    bound: list[Allocation],
    known: list[GangSpec],
    fragmentation: FragmentationScore | None,
) -> Assembly:
    gang = settings.gang
    return assemble(
        nodes.values(),
        TracedBinder(port),  # a span per bind and eviction, in the decision's trace
        backoff=BackoffPolicy(gang.backoff_initial_s, max(gang.backoff_max_s, gang.backoff_initial_s)),
        max_parked_s=gang.max_parked_s,
        bound=bound,
        gangs_known=known,
        fragmentation=fragmentation,
        pipeline=settings.pipelined_binds,
    )


def recover_gangs(
    state: EngineState, pending: list[PendingGang], bound: list[Allocation], recorded: set[str], now: float
) -> list[GangOutcome]:
    """Gangs bound below quorum are broken; gangs bound but never recorded are placed; the rest
    get back their attempts and backoff."""
    scheduler, queue, registry = state.assembly.scheduler, state.assembly.queue, state.assembly.registry
    outcomes = scheduler.recover(now)
    broken = {outcome.gang for outcome in outcomes}
    for row in pending:
        gang = row.job_id
        if gang not in registry or gang in broken:
            continue
        spec = registry.spec(gang)
        newly_bound = tuple(a for a in bound if a.gang == gang and a.pod not in recorded)
        if newly_bound and len(registry.bound(gang)) >= spec.min_available:
            # Bound on the cluster before the scheduler stopped, never recorded: record it now.
            if not registry.pending(gang):
                queue.remove(gang)
            outcomes.append(GangOutcome(gang, OutcomeKind.PLACED, bound=newly_bound))
            continue
        if gang in queue and row.attempts and row.backoff_until is not None:
            reason = RequeueReason(row.reason_code) if row.reason_code else RequeueReason.UNSCHEDULABLE
            entry = queue.requeue(gang, reason, now, hints=ALL_EVENTS, message=row.last_reason)
            entry.attempts = row.attempts
            entry.backoff_until = row.backoff_until.timestamp()
    return outcomes


def _gang_of(
    pod: Pod, gangs: Mapping[str, GangInfo], specs: Mapping[str, JobSpec], jobs_namespace: str
) -> str | None:
    """The gang being rebuilt that ``pod`` is a member of, if any: a pending job's (its spec known,
    the pod in one of its namespaces), else its PodGroup's, else its own."""
    job_id = pod.labels.get(JOB_ID_LABEL)
    if job_id:
        spec = specs.get(job_id)
        member = spec is not None and pod.namespace in job_namespaces(spec, jobs_namespace)
        return job_id if member and job_id in gangs else None
    gang = f"{pod.namespace}/{pod.pod_group}" if pod.pod_group else pod_key(pod)
    return gang if gang in gangs else None


def _cluster_allocation(pod: Pod, gang: str, uuids: Mapping[int, str]) -> Allocation | None:
    if pod.assignment is None or pod.node_name is None:
        return None
    index_of = {uuid: index for index, uuid in uuids.items()}
    gpus = tuple(
        (index_of[share.gpu_uuid], share.milli)
        for share in pod.assignment.shares
        if share.gpu_uuid in index_of
    )
    return Allocation(
        pod_key(pod), gang, pod.node_name, gpus, pod.requirements.cpu_milli, pod.requirements.memory_mib
    )
