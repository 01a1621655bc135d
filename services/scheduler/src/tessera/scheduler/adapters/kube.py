"""The scheduler's ports on the cluster: bind and evict through the `Cluster` port.

The scheduler creates no pods: the workloads' controllers do (admission's Indexed Jobs, users' own
Jobs, JobSets and Deployments), and the scheduler places and binds what they create.

The gang scheduler runs its cycles on a thread of its own and binds synchronously (a bind failing
halfway must be rolled back before the cycle goes on), so :class:`ClusterBinder` hands each call to
the service's event loop and waits for it. Without a cluster, :class:`InventoryBinder` stands in:
a placement is then real once it is recorded.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tessera.cluster.cache import pod_key
from tessera.cluster.conventions.names import JOB_ID_LABEL
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.domain.requirements import Pod, PodRef
from tessera.cluster.port import AlreadyBound, Cluster, ClusterError, NotFound
from tessera.scheduler.domain.plugins.reserve import BindError
from tessera.scheduler.domain.snapshot import Allocation

log = logging.getLogger(__name__)

__all__ = ["JOB_ID_LABEL", "ClusterBinder", "Evictions", "InventoryBinder"]

Asked = tuple[str, str]  # a pod's key and uid


class BlockingBind(Protocol):
    """``Cluster.bind`` on the calling thread (``KubernetesCluster.bind_blocking``); TimeoutError
    when no answer came in time."""

    def __call__(
        self,
        ref: PodRef,
        node: str,
        assignment: DeviceAssignment | None = None,
        timeout_s: float | None = None,
    ) -> None: ...


class Evictions:
    """The pods the scheduler asked to evict, by key and uid, until they are seen going (being
    deleted, ended, gone) or their eviction is refused. An eviction the API accepted shows on the
    watch only later; meanwhile the pod still looks bound by our bind, and must not rejoin a gang.
    ``uid_of`` gives the uid of the pod of a key as the watches see it (None: no such pod);
    ``on_refused`` is told the key of a pod whose eviction was refused (it may rejoin its gang now,
    though no watch event of it may come for a while). Those refused are remembered too, until
    they are seen going: a pod the scheduler evicts for belonging to no gang is asked again only
    after a backoff (``retry_s``, doubling at each refusal up to ``max_retry_s``, by ``clock``), not
    at each of its events (:meth:`tried`), and not never: a refusal may pass (:meth:`due`)."""

    def __init__(
        self,
        uid_of: Callable[[str], str | None] = lambda _: None,
        on_refused: Callable[[str], None] = lambda _: None,
        clock: Callable[[], float] = time.time,
        retry_s: float = 30.0,
        max_retry_s: float = 300.0,
    ) -> None:
        self._uid_of = uid_of
        self._on_refused = on_refused
        self.clock = clock
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self._asked: set[Asked] = set()
        self._refusals: dict[Asked, int] = {}
        self._retry_at: dict[Asked, float] = {}

    def uid_of(self, pod: str) -> str | None:
        """The uid of the pod of key ``pod`` as the watches see it (None: no such pod)."""
        return self._uid_of(pod)

    def asked(self, pod: str) -> Asked | None:
        """The scheduler asks to evict ``pod``: noted under its current uid, which is returned."""
        uid = self._uid_of(pod)
        if uid is None:
            return None
        self._asked.add((pod, uid))
        return pod, uid

    def refused(self, asked: Asked | None) -> None:
        """The eviction was refused (a disruption budget, throttling, no answer): the pod stays, and
        may be asked again after the backoff."""
        if asked is not None and asked in self._asked:
            self._asked.discard(asked)
            count = self._refusals.get(asked, 0) + 1
            self._refusals[asked] = count
            backoff = min(self.retry_s * 2 ** min(count - 1, 32), self.max_retry_s)
            self._retry_at[asked] = self.clock() + backoff
            self._on_refused(asked[0])

    def pending(self, pod: Pod) -> bool:
        """Whether ``pod`` is one the scheduler asked to evict and has not been seen going yet; one
        seen going (being deleted, ended) is forgotten."""
        asked = (pod_key(pod), pod.uid)
        if pod.deleting or pod.terminated:
            self.gone(asked)
        return asked in self._asked

    def tried(self, pod: Pod) -> bool:
        """Whether the scheduler asked to evict ``pod`` (the same uid) since it was last seen going
        and is not to ask again yet: the eviction is pending, or was refused within the backoff."""
        asked = (pod_key(pod), pod.uid)
        return self.pending(pod) or self.clock() < self._retry_at.get(asked, -math.inf)

    def due(self) -> list[Asked]:
        """The pods whose eviction was refused and may be asked again now (none pending)."""
        now = self.clock()
        return [asked for asked, at in self._retry_at.items() if at <= now and asked not in self._asked]

    def defer(self, asked: Asked) -> None:
        """A refused pod to ask again only after the longest backoff (``max_retry_s``), whatever its
        refusals: one that cannot be evicted now (its node left) but may be later."""
        if asked in self._retry_at:
            self._retry_at[asked] = self.clock() + self.max_retry_s

    def forget(self, asked: Asked) -> None:
        """A refused pod not to evict again (it rejoined a live gang, or is no longer there)."""
        self._refusals.pop(asked, None)
        self._retry_at.pop(asked, None)

    def gone(self, pod: Pod | Asked | None) -> None:
        """``pod`` is gone from the cluster."""
        if isinstance(pod, Pod):
            pod = pod_key(pod), pod.uid
        if pod is not None:
            self._asked.discard(pod)
            self.forget(pod)


@dataclass
class InventoryBinder:
    """No cluster to bind on: a placement is real once recorded. Evictions are only noted."""

    evicted: list[Allocation] = field(default_factory=list)

    def bind(self, allocation: Allocation) -> None:
        return None

    def evict(self, allocation: Allocation) -> None:
        self.evicted.append(allocation)

    async def settle(self) -> None:
        return None


class ClusterBinder:
    """Binding subresource with the ``tessera.io/gpu-assignment`` annotation; Eviction API to undo.

    The annotation names the node and the uid of the pod bound, as the watches see it: that is how
    the scheduler tells its own binds (:func:`~tessera.scheduler.service_layer.bound_pods.our_bind`)
    from a pod someone bound by hand with a copy of the annotation, whose uid differs. That uid is
    the Binding's precondition too (``metadata.uid``, as kube-scheduler sends it): a pod made again
    under the same name since the watches saw it (LeaderWorkerSet workers are) is refused with 409
    Conflict, not bound with an assignment naming the pod before it; the bind fails (BindError) and
    its gang is rolled back as for any failed bind."""

    def __init__(
        self,
        cluster: Cluster,
        loop: asyncio.AbstractEventLoop,
        uuids: Callable[[str], Mapping[int, str]],
        timeout_s: float = 30.0,
        evictions: Evictions | None = None,
    ) -> None:
        self.cluster = cluster
        self.evictions = evictions if evictions is not None else Evictions()
        self.loop = loop
        self.uuids = uuids
        self.timeout_s = timeout_s
        self._background: set[asyncio.Task[None]] = set()
        # A cluster that can bind on the calling thread (the Kubernetes adapter) does: a bind then
        # costs no hop to the event loop and its pool and back, only the request.
        offer = getattr(cluster, "blocking_binds", None)
        self._bind_blocking: BlockingBind | None = offer() if callable(offer) else None

    async def settle(self) -> None:
        """Wait for evictions started in the background (before the evicted pods are recreated)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def bind(self, allocation: Allocation) -> None:
        node_uuids = self.uuids(allocation.node)
        shares = tuple(
            GpuShare(node_uuids.get(index, f"{allocation.node}-gpu-{index}"), milli)
            for index, milli in allocation.gpu_milli
        )
        assignment = DeviceAssignment(allocation.node, shares, self.evictions.uid_of(allocation.pod))
        ref = PodRef.parse(allocation.pod)
        try:
            if self._bind_blocking is None:
                self._wait(self.cluster.bind(ref, allocation.node, assignment))
            elif self._on_loop():
                raise BindError("a bind must run on the scheduling thread, not on the event loop")
            else:
                self._bind_blocking(ref, allocation.node, assignment, timeout_s=self.timeout_s)
        except AlreadyBound as error:
            # Bound by an earlier attempt whose answer was lost: fine if it is where we put it.
            if self._node_of(ref) != allocation.node:
                raise BindError(f"{allocation.pod} to {allocation.node}: {error}") from error
        except TimeoutError as error:
            # The bind may still land: make sure the pod holds nothing before the gang is requeued.
            if self._node_of(ref) is not None:
                self.evict(allocation)
            raise BindError(
                f"{allocation.pod} to {allocation.node}: no answer in {self.timeout_s}s"
            ) from error
        except (ClusterError, OSError) as error:
            raise BindError(f"{allocation.pod} to {allocation.node}: {error}") from error

    def _node_of(self, ref: PodRef) -> str | None:
        async def read() -> str | None:
            try:
                return (await self.cluster.get_pod(ref)).node_name
            except NotFound:
                return None

        try:
            return asyncio.run_coroutine_threadsafe(read(), self.loop).result(self.timeout_s)
        except (ClusterError, OSError, TimeoutError):
            return None

    def evict(self, allocation: Allocation) -> None:
        call = self._evict(allocation.pod, self.evictions.asked(allocation.pod))
        if self._on_loop():
            # A rebuild or a watch event broke a gang on the loop itself: evict in the background.
            task = self.loop.create_task(call)
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            return
        try:
            asyncio.run_coroutine_threadsafe(call, self.loop).result(self.timeout_s)
        except TimeoutError:
            log.warning("eviction got no answer in time", extra={"pod": allocation.pod})

    async def _evict(self, pod: str, asked: Asked | None) -> None:
        try:
            await self.cluster.evict(PodRef.parse(pod), grace_period_seconds=0)
        except NotFound:
            self.evictions.gone(asked)
        except (ClusterError, OSError, TimeoutError) as error:
            self.evictions.refused(asked)
            # The pod keeps running. A member of a gang bound below quorum is evicted again at the
            # next rebuild; a pod of no live gang after the backoff (Evictions.due, Evictions.tried).
            log.warning("eviction failed", extra={"pod": pod, "error": str(error)})

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def _wait(self, call: Coroutine[Any, Any, None]) -> None:
        if self._on_loop():
            call.close()
            raise BindError("a bind must run on the scheduling thread, not on the event loop")
        future = asyncio.run_coroutine_threadsafe(call, self.loop)
        try:
            future.result(self.timeout_s)
        except TimeoutError:
            future.cancel()
            raise
