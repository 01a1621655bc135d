"""The scheduling loop: one cycle at a time, fed by admitted jobs, inventory and cluster watches.

Each cycle runs as named steps under the scheduler's advisory lock, in one transaction:
sync inputs (inventory, new pending gangs, every few minutes the typical workload, cluster
changes) -> free what finished -> run the gang scheduler (assume, permit, bind) -> persist the
outcomes and queue their events. Binding happens inside the gang scheduler, on a thread of its
own, while the event loop serves the bind calls.

Nothing lives only here: pending gangs and placements are in the scheduler's schema and the
cluster is the record of what is bound, so a restart (or any failed cycle) rebuilds this state.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tessera.cluster.domain.requirements import PodPhase
from tessera.cluster.port import WatchEvent
from tessera.contracts.base import Message
from tessera.contracts.events import DemandChanged, GangFinished, ReportJobOutcome
from tessera.core.db.uow import UnitOfWork
from tessera.core.observability.ratelimit import RateLimitedLog
from tessera.core.observability.tracing import span_from_headers
from tessera.scheduler.adapters.cluster_side import ClusterSide
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.domain.cache import CacheConflict
from tessera.scheduler.domain.gang.assembly import Assembly
from tessera.scheduler.domain.gang.scheduler import GangOutcome, OutcomeKind
from tessera.scheduler.service_layer.engine_state import EngineState
from tessera.scheduler.service_layer.gangs import (
    inventory_node,
    inventory_uuids,
    job_gang,
    job_pod_names,
    pod_name,
    waiting_demand,
)
from tessera.scheduler.service_layer.outcomes import GangInfo, publish_at_commit, record_outcome
from tessera.scheduler.service_layer.preemption import preempt_due
from tessera.scheduler.service_layer.rebuild import learn_typical_workload, rebuild
from tessera.scheduler.service_layer.repository_port import JOB, SchedulerRepository
from tessera.scheduler.service_layer.tracing import DecisionSpans
from tessera.scheduler.service_layer.unit_of_work import SchedulerUnitOfWork
from tessera.scheduler.service_layer.watches import WatchState, native_keys

log = logging.getLogger(__name__)

UowFactory = Callable[[], SchedulerUnitOfWork]


class SchedulingEngine:
    """Schedules on ``cluster`` when given one (and subscribes to its watches); otherwise on the
    inventory telemetry reports."""

    def __init__(
        self,
        uow: UowFactory,
        settings: SchedulerSettings,
        cluster: ClusterSide | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._uow = uow
        self.settings = settings
        self.cluster: ClusterSide | None = None
        self.clock = clock
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scheduler-cycle")
        self._wake = asyncio.Event()
        self._events: deque[tuple[str, WatchEvent[object]]] = deque()
        self._unhealthy: deque[tuple[str, int]] = deque()
        # Telemetry's "GPU unhealthy" marks in cluster mode, by GPU UUID (a node made again under the
        # same name has other GPUs): the node records come from the API and know nothing of them, so
        # each rebuild lays them on again (_sync_health_marks).
        self._health_marks: set[str] = set()
        self._next_preemption: float | None = None
        self._version = -1
        self.state: EngineState | None = None
        self.cycles = 0
        self._published_at_commit = 0  # events this cycle queued for its commit
        self.deciding = False
        """Whether the loop runs (this replica leads); watch events are kept only meanwhile."""
        self.failures = RateLimitedLog(log)
        """A cycle failing every round (the database away) is logged once per interval."""
        if cluster is not None:
            self.attach(cluster)

    def attach(self, cluster: ClusterSide) -> None:
        """Watch and bind through ``cluster`` from the next rebuild on; its watch events feed the cycles."""
        cluster.subscribe(self.on_watch)
        cluster.evictions.clock = self.clock  # refused evictions are asked again by the loop's time
        self.cluster = cluster

    # -- inputs (safe from handlers after commit and from watch callbacks) ------------------------

    def wake(self) -> None:
        self._wake.set()

    def gpu_unhealthy(self, node: str, index: int) -> None:
        self._unhealthy.append((node, index))
        self._wake.set()

    def on_watch(self, kind: str, event: WatchEvent[object]) -> None:
        if not self.deciding:
            return  # a follower: the first cycle it leads rebuilds from the watches' cache anyway
        self._events.append((kind, event))
        self._wake.set()

    @property
    def assembly(self) -> Assembly:
        if self.state is None:
            raise RuntimeError("the scheduling engine has not been started")
        return self.state.assembly

    # -- the loop --------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Decide, a cycle at a time, until ``stop``; then forget the state, so that running again
        (this replica leading again) starts from a rebuild."""
        self.deciding = True
        try:
            while not stop.is_set():
                try:
                    await self.cycle()
                except Exception as exc:
                    self.failures.error(
                        f"cycle:{type(exc).__name__}",
                        "scheduling cycle failed; state is rebuilt from the database and the cluster",
                        exc_info=True,
                    )
                    self.state = None
                await self._sleep(stop)
        finally:
            self.deciding = False
            self.state = None
            self._events.clear()

    def close(self) -> None:
        """The service stops: the cycle's thread goes."""
        self._executor.shutdown(wait=False)

    async def _sleep(self, stop: asyncio.Event) -> None:
        timeout = self.settings.poll_s
        if self.state is not None:
            for due in (self.state.assembly.scheduler.next_wakeup(), self._next_preemption):
                if due is not None:
                    timeout = min(timeout, max(0.0, due - self.clock()))
        waiters = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
        self._wake.clear()

    async def cycle(self) -> list[GangOutcome]:
        """One scheduling cycle; returns the gang scheduler's outcomes."""
        self.cycles += 1
        self._published_at_commit = 0
        async with self._uow() as uow:
            repo = uow.repo
            await repo.lock_for_decision()
            now = self.clock()
            outcomes: list[GangOutcome] = []
            version = await repo.decision_version()
            if self.state is not None and version != self._version:
                log.info("another replica decided since the last cycle; rebuilding")
                self.state = None
            if self.state is None:
                self._events.clear()  # the rebuild lists everything afresh
                self.state = await rebuild(repo, self.settings, self.cluster, now)
                outcomes += self.state.recovered
                if self.cluster is not None:
                    # PodGroups created while the scheduler was away join the queue now.
                    watches = WatchState(self.state, self.cluster, self.settings, now)
                    cache = self.cluster.cache
                    for key in native_keys(cache.pods.store, cache.pod_groups.store):
                        outcomes += await watches.refresh_native(repo, key)
                    watches.let_go_held()  # pods of ours whose gang is gone
            state = self.state
            if self.cluster is None:
                # Whichever replica took the inventory message, every replica sees the stored one.
                stamp = await repo.inventory_stamp()
                if stamp != state.inventory_stamp:
                    state.inventory_stamp = stamp
                    outcomes += await self._sync_inventory(repo, now)
            else:
                # Telemetry's stored inventory holds its health marks: after a rebuild (no stamp
                # yet) and whenever it changes, the cache's marks follow it.
                stamp = await repo.inventory_stamp()
                if stamp != state.inventory_stamp:
                    state.inventory_stamp = stamp
                    await self._sync_health_marks(repo, now)
            outcomes += await self._sync_pending(repo, now)
            await self._learn_typical_workload(repo, now)
            if self.cluster is not None:
                watches = WatchState(state, self.cluster, self.settings, now)
                while self._events:
                    kind, event = self._events.popleft()
                    outcomes += await watches.apply(repo, kind, event)
                watches.retry_evictions()  # refused evictions whose backoff is over
            while self._unhealthy:
                node, index = self._unhealthy.popleft()
                if node in state.nodes:
                    with contextlib.suppress(CacheConflict):
                        state.assembly.scheduler.gpu_health_changed(node, index, False, now)
                        uuid = state.uuids.get(node, {}).get(index)
                        if self.cluster is not None and uuid is not None:
                            self._health_marks.add(uuid)
            await self._finish_ended(repo, uow, now)
            self._next_preemption = await preempt_due(repo, uow, state, self.cluster, self.settings, now)
            loop = asyncio.get_running_loop()
            spans = DecisionSpans(state.gangs)  # each attempt's span, open until its outcome is recorded
            try:
                run = functools.partial(state.assembly.scheduler.run, now, around=spans.around)
                outcomes += await loop.run_in_executor(self._executor, run)
                for outcome in outcomes:
                    info = state.gangs.get(outcome.gang)
                    if info is None:
                        continue
                    span = spans.take(outcome)
                    await record_outcome(outcome, info, state.assembly.queue, repo, uow, state.uuids, span)
            finally:
                spans.close()
            await self._finish_ended(repo, uow, now)
            await self._report_running(uow)
            await self._announce_demand(uow)
            decided = (
                bool(uow.published)
                or self._published_at_commit > 0
                or any(o.kind is not OutcomeKind.WAITING for o in outcomes)
            )
            version = await repo.bump_decision_version() if decided else version
            await uow.commit()
            self._version = version
        return outcomes

    def _publish(self, uow: UnitOfWork, message: Message) -> None:
        """An event of this cycle, written to the outbox with the others at commit."""
        publish_at_commit(uow, message)
        self._published_at_commit += 1

    # -- steps -----------------------------------------------------------------------------------

    async def _sync_health_marks(self, repo: SchedulerRepository, now: float) -> None:
        """Cluster mode: the cache's "GPU unhealthy" marks follow telemetry. The stored inventory is
        its last word on each GPU it names (matched by UUID; a ``gpu_unhealthy`` is written into it
        too): a GPU it reports unhealthy is marked, one it reports healthy loses its mark. Marks for
        GPUs it does not name (no report for the node yet) are those this process received, kept by
        GPU UUID across rebuilds in the engine, not in the database; a node made again under the same
        name with other GPUs inherits none. A mark is lifted only where the node's own record says
        the GPU is healthy."""
        assert self.state is not None
        state = self.state
        for inventory in await repo.inventory():
            for gpu in inventory.gpus:
                if gpu.healthy:
                    self._health_marks.discard(gpu.uuid)
                else:
                    self._health_marks.add(gpu.uuid)
        scheduler, cache = state.assembly.scheduler, state.assembly.cache
        for node, info in state.nodes.items():
            uuids = state.uuids.get(node, {})
            wanted = {index for index, uuid in uuids.items() if uuid in self._health_marks}
            have = cache.health_marks(node)
            for index in sorted(wanted - have):
                if index < len(info.gpus):
                    scheduler.gpu_health_changed(node, index, False, now)
            for index in sorted(have - wanted):
                if info.gpus[index].healthy:
                    scheduler.gpu_health_changed(node, index, True, now)

    async def _sync_inventory(self, repo: SchedulerRepository, now: float) -> list[GangOutcome]:
        assert self.state is not None
        state, scheduler = self.state, self.state.assembly.scheduler
        outcomes: list[GangOutcome] = []
        seen = set()
        for node in await repo.inventory():
            seen.add(node.name)
            info = inventory_node(node)
            state.uuids[node.name] = inventory_uuids(node)
            if state.nodes.get(node.name) != info:
                state.nodes[node.name] = info
                outcomes += scheduler.node_changed(info, now)
            # The stored inventory keeps telemetry's marks until a report says otherwise: a GPU it
            # reports healthy again has recovered.
            for index in sorted(state.assembly.cache.health_marks(node.name)):
                if index < len(info.gpus) and info.gpus[index].healthy:
                    scheduler.gpu_health_changed(node.name, index, True, now)
        for name in sorted(set(state.nodes) - seen):
            del state.nodes[name]
            outcomes += scheduler.node_lost(name, now)
        return outcomes

    async def _learn_typical_workload(self, repo: SchedulerRepository, now: float) -> None:
        """Every so often, the fragmentation score learns the workload again from the placements."""
        assert self.state is not None
        state, profile = self.state, self.settings.workload_profile
        if state.fragmentation is None:
            return
        if state.workload_learnt_at is not None and now - state.workload_learnt_at < profile.refresh_s:
            return
        state.fragmentation.expect(await learn_typical_workload(repo, profile))
        state.workload_learnt_at = now

    async def _sync_pending(self, repo: SchedulerRepository, now: float) -> list[GangOutcome]:
        """Gangs admitted since the last cycle join the queue: on a cluster with the pods their
        workloads created so far (more join as they come), in inventory mode as named members.
        Returns the gangs placed by pods found bound by our bind (:meth:`WatchState.adopt`)."""
        assert self.state is not None
        state = self.state
        outcomes: list[GangOutcome] = []
        new = await repo.pending_ids() - set(state.gangs)
        if not new:
            return outcomes
        for row in await repo.pending(only=new):
            if row.source != JOB or row.spec is None:
                continue
            submitted = row.submitted_at.timestamp()
            info = GangInfo(
                row.job_id, JOB, dict(row.trace), resume_from=row.resume_from, submitted_at=submitted
            )
            state.gangs[row.job_id] = info
            state.specs[row.job_id] = row.spec
            if self.cluster is not None:
                outcomes += WatchState(state, self.cluster, self.settings, now).refresh_job(row.job_id)
                continue
            namespace = self.settings.namespace
            info.groups = {m.key: m.group for m in job_pod_names(row.job_id, row.spec, namespace)}
            gang = job_gang(row.job_id, row.spec, namespace, submitted, self.settings.gang.timeout_s)
            state.assembly.scheduler.submit(gang)
        return outcomes

    async def _finish_ended(self, repo: SchedulerRepository, uow: UnitOfWork, now: float) -> None:
        """Gangs whose every placed pod ended: free them, tell admission, retry what waits."""
        assert self.state is not None
        state = self.state
        for gang, info in list(state.gangs.items()):
            if not info.placed or any(phase is None for phase in info.placed.values()):
                continue
            if gang in state.assembly.queue:
                continue
            state.assembly.scheduler.gang_finished(gang, now)
            await repo.release_job(info.job_id)
            await repo.remove_pending(info.job_id)
            succeeded = all(phase == "Succeeded" for phase in info.placed.values())
            pods = {pod_name(pod): phase or "" for pod, phase in info.placed.items()}
            with span_from_headers("scheduler.gang_finished", info.trace, job_id=info.job_id):
                self._publish(uow, GangFinished(job_id=info.job_id, succeeded=succeeded, pods=pods))
            del state.gangs[gang]
            state.specs.pop(gang, None)
            log.debug("gang finished", extra={"job_id": info.job_id, "succeeded": succeeded})  # in its event

    async def _report_running(self, uow: UnitOfWork) -> None:
        """A job whose every placed pod runs is reported running to admission, once. After a restart
        the report may repeat; admission ignores a job already running."""
        assert self.state is not None
        if self.cluster is None:
            return
        pods = self.cluster.cache.pods.store
        for info in self.state.gangs.values():
            if info.source != JOB or info.running_reported or not info.placed:
                continue
            live = [pods.get(pod) for pod in info.placed]
            if all(p is not None and p.phase is PodPhase.RUNNING for p in live):
                info.running_reported = True
                with span_from_headers("scheduler.gang_running", info.trace, job_id=info.job_id):
                    self._publish(
                        uow,
                        ReportJobOutcome(
                            job_id=info.job_id, state="running", reason=f"all {len(live)} pods running"
                        ),
                    )

    async def _announce_demand(self, uow: UnitOfWork) -> None:
        """Publish the GPU demand of the gangs that wait when it changed (slicing plans from it)."""
        assert self.state is not None
        queue, registry = self.state.assembly.queue, self.state.assembly.registry
        waiting = [gang for gang in self.state.gangs if gang in queue and gang in registry]
        event = DemandChanged(
            pending_gangs=len(waiting),
            demand=waiting_demand(pod for gang in waiting for pod in registry.pending(gang)),
        )
        if event != self.state.last_demand and (waiting or self.state.last_demand is not None):
            self._publish(uow, event)
            self.state.last_demand = event
