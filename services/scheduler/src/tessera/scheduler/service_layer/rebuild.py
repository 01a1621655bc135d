"""Rebuilding the scheduler's state at start (or after a failed cycle) from Postgres and the cluster.

Inventory mode: nodes from the stored inventory, allocations from the placements table. Cluster
mode: nodes and pods from the watches; the placements table plus any bound pod of ours the table
does not know yet (the scheduler stopped between a bind and its commit). Pending gangs come back
with their attempts and backoff; a gang found bound below its quorum is evicted and requeued, so
nothing stays held by a partial gang and nothing is bound twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tessera.cluster.conventions.names import SCHEDULER_NAME
from tessera.cluster.domain import Node, Pod, PodGroup
from tessera.cluster.port import Cluster, WatchEvent
from tessera.cluster.reflector import Reflector
from tessera.contracts.events import DemandChanged
from tessera.contracts.jobs import JobSpec
from tessera.scheduler.adapters.kube import JOB_ID_LABEL, ClusterBinder, InventoryBinder, JobMaterializer
from tessera.scheduler.adapters.repository import JOB, PODGROUP, SchedulerRepository
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.domain.cache import CacheConflict
from tessera.scheduler.domain.framework.cluster_view import node_info
from tessera.scheduler.domain.framework.pod import InvalidSpec
from tessera.scheduler.domain.gang.assembly import Assembly, assemble
from tessera.scheduler.domain.gang.queue import ALL_EVENTS, BackoffPolicy, RequeueReason
from tessera.scheduler.domain.gang.scheduler import GangOutcome, OutcomeKind
from tessera.scheduler.domain.gang.spec import GangSpec
from tessera.scheduler.domain.placement import TypicalPod
from tessera.scheduler.domain.plugins.fragmentation import FragmentationScore
from tessera.scheduler.domain.snapshot import Allocation, NodeInfo
from tessera.scheduler.service_layer.gangs import inventory_node, inventory_uuids, job_gang, job_pod_names
from tessera.scheduler.service_layer.outcomes import GangInfo
from tessera.scheduler.service_layer.watches import foreign_allocation, native_gang, native_of, pod_key

# The workload the fragmentation score expects when it knows nothing better: mostly shares of one
# GPU and single GPUs, some multi-GPU pods (the shape of Alibaba's openb trace).
TYPICAL_WORKLOAD = (
    TypicalPod(4000, 1, 250, frozenset(), 0.2),
    TypicalPod(4000, 1, 500, frozenset(), 0.25),
    TypicalPod(8000, 1, 1000, frozenset(), 0.35),
    TypicalPod(16000, 2, 1000, frozenset(), 0.1),
    TypicalPod(32000, 4, 1000, frozenset(), 0.05),
    TypicalPod(64000, 8, 1000, frozenset(), 0.05),
)


class ClusterSide:
    """The cluster as the scheduler watches and changes it: reflectors, the port and job pods."""

    def __init__(
        self,
        cluster: Cluster,
        materializer: JobMaterializer,
        on_event: Callable[[str, WatchEvent[Any]], None],
    ) -> None:
        self.cluster = cluster
        self.materializer = materializer
        self.nodes: Reflector[Node] = Reflector(
            "nodes", cluster.list_nodes, cluster.watch_nodes, key=lambda n: n.name
        )
        self.pods: Reflector[Pod] = Reflector(
            "pods",
            cluster.list_pods,
            lambda rv: cluster.watch_pods(rv),
            key=pod_key,
        )
        self.pod_groups: Reflector[PodGroup] = Reflector(
            "podgroups", cluster.list_pod_groups, lambda rv: cluster.watch_pod_groups(rv), key=lambda g: g.key
        )
        self.nodes.subscribe(lambda event: on_event("node", event))
        self.pods.subscribe(lambda event: on_event("pod", event))
        self.pod_groups.subscribe(lambda event: on_event("podgroup", event))
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, timeout: float = 30.0) -> None:
        """Start the watches and wait until each has listed; TimeoutError leaves them trying."""
        reflectors: tuple[Reflector[Any], ...] = (self.nodes, self.pods, self.pod_groups)
        if not self._tasks:
            self._tasks = [asyncio.create_task(r.run(), name=f"scheduler-watch-{r.name}") for r in reflectors]
        async with asyncio.timeout(timeout):
            await asyncio.gather(*(r.synced.wait() for r in reflectors))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []


@dataclass
class Rebuilt:
    assembly: Assembly
    gangs: dict[str, GangInfo]
    specs: dict[str, JobSpec]
    uuids: dict[str, dict[int, str]]
    nodes: dict[str, NodeInfo]
    port: InventoryBinder | ClusterBinder
    recovered: list[GangOutcome] = field(default_factory=list)
    to_materialize: set[str] = field(default_factory=set)
    native_submitted: dict[str, float] = field(default_factory=dict)
    last_demand: DemandChanged | None = None
    inventory_stamp: tuple[int, datetime | None] | None = None


def _cluster_allocation(pod: Pod, gang: str, uuids: dict[int, str]) -> Allocation | None:
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


async def rebuild(
    repo: SchedulerRepository, settings: SchedulerSettings, cluster: ClusterSide | None, now: float
) -> Rebuilt:
    uuids: dict[str, dict[int, str]] = {}
    nodes: dict[str, NodeInfo] = {}
    stamp = await repo.inventory_stamp() if cluster is None else None
    if cluster is None:
        for inventory in await repo.inventory():
            nodes[inventory.name] = inventory_node(inventory)
            uuids[inventory.name] = inventory_uuids(inventory)
    else:
        for node in cluster.nodes.store.values():
            with contextlib.suppress(InvalidSpec):
                nodes[node.name] = node_info(node)
                uuids[node.name] = {gpu.index: gpu.uuid for gpu in node.gpus}
    gangs: dict[str, GangInfo] = {}
    specs: dict[str, JobSpec] = {}
    gang_specs: list[GangSpec] = []
    native_submitted: dict[str, float] = {}
    pending = await repo.pending()
    for row in pending:
        if row.source == JOB and row.spec is not None:
            members = job_pod_names(row.job_id, row.spec, settings.namespace)
            gangs[row.job_id] = GangInfo(row.job_id, JOB, dict(row.trace), {m.key: m.group for m in members})
            specs[row.job_id] = row.spec
            gang_specs.append(
                job_gang(
                    row.job_id,
                    row.spec,
                    settings.namespace,
                    row.submitted_at.timestamp(),
                    settings.gang.timeout_s,
                )
            )
        elif row.source == PODGROUP and cluster is not None:
            found = native_of(cluster.pods.store, cluster.pod_groups.store, row.job_id)
            if found is None or not found[1]:
                await repo.remove_pending(row.job_id)
                continue
            group, live = found
            gangs[row.job_id] = GangInfo(row.job_id, PODGROUP, {}, {pod_key(p): group.name for p in live})
            native_submitted[row.job_id] = row.submitted_at.timestamp()
            gang_specs.append(native_gang(group, live, native_submitted[row.job_id]))
    bound: list[Allocation] = []
    ended: list[tuple[str, str]] = []
    known_pods: set[str] = set()
    for placed in await repo.placements():
        info = gangs.setdefault(placed.job_id, GangInfo(placed.job_id, JOB))
        info.groups.setdefault(placed.pod, placed.pod_group)
        info.placed[placed.pod] = None
        known_pods.add(placed.pod)
        if cluster is not None:
            live_pod = cluster.pods.store.get(placed.pod)
            if live_pod is None or live_pod.terminated:
                ended.append((placed.pod, live_pod.phase.value if live_pod else "Deleted"))
                info.placed[placed.pod] = ended[-1][1]
                continue
        if placed.node in nodes:
            bound.append(
                Allocation(
                    placed.pod, placed.job_id, placed.node, placed.gpus, placed.cpu_milli, placed.memory_mib
                )
            )
    foreign: list[Allocation] = []
    if cluster is not None:
        for pod in cluster.pods.store.values():
            key = pod_key(pod)
            gang = pod.labels.get(JOB_ID_LABEL) or (
                f"{pod.namespace}/{pod.pod_group}" if pod.pod_group else key
            )
            if pod.bound and not pod.terminated and pod.scheduler_name != SCHEDULER_NAME:
                if pod.node_name in nodes:
                    foreign.append(foreign_allocation(pod, uuids.get(pod.node_name or "", {})))
                continue
            if key in known_pods or pod.terminated or not pod.bound or gang not in gangs:
                continue
            allocation = _cluster_allocation(pod, gang, uuids.get(pod.node_name or "", {}))
            if allocation is not None and allocation.node in nodes:
                bound.append(allocation)
    loop = asyncio.get_running_loop()
    port: InventoryBinder | ClusterBinder = (
        InventoryBinder()
        if cluster is None
        else ClusterBinder(cluster.cluster, loop, lambda node: uuids.get(node, {}), settings.bind_timeout_s)
    )
    models = sorted({gpu.model for node in nodes.values() for gpu in node.gpus})
    assembly = assemble(
        nodes.values(),
        port,
        backoff=BackoffPolicy(
            settings.gang.backoff_initial_s, max(settings.gang.backoff_max_s, settings.gang.backoff_initial_s)
        ),
        max_parked_s=settings.gang.max_parked_s,
        bound=bound,
        gangs_known=gang_specs,
        fragmentation=FragmentationScore(TYPICAL_WORKLOAD, models) if models else None,
    )
    for allocation in foreign:  # best effort: a pod the cache cannot fit is left out, not fatal
        with contextlib.suppress(CacheConflict):
            assembly.cache.assume(allocation)
            assembly.cache.confirm_bound(allocation.pod)
    state = Rebuilt(
        assembly, gangs, specs, uuids, nodes, port, native_submitted=native_submitted, inventory_stamp=stamp
    )
    state.recovered = _recover(state, pending, bound, known_pods, now)
    if cluster is not None:
        state.to_materialize.update(
            gang for gang, info in gangs.items() if info.source == JOB and gang in specs
        )
    return state


def _recover(
    state: Rebuilt, pending: list[Any], bound: list[Allocation], known_pods: set[str], now: float
) -> list[GangOutcome]:
    scheduler, queue, registry = state.assembly.scheduler, state.assembly.queue, state.assembly.registry
    outcomes = scheduler.recover(now)
    broken = {outcome.gang for outcome in outcomes}
    for row in pending:
        gang = row.job_id
        if gang not in registry or gang in broken:
            continue
        spec = registry.spec(gang)
        newly_bound = tuple(a for a in bound if a.gang == gang and a.pod not in known_pods)
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
