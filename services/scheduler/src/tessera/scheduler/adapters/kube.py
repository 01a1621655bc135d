"""The scheduler's ports on the cluster: bind and evict through the `Cluster` port, create job pods.

The gang scheduler runs its cycles on a thread of its own and binds synchronously (a bind failing
halfway must be rolled back before the cycle goes on), so :class:`ClusterBinder` hands each call to
the service's event loop and waits for it. Without a cluster, :class:`InventoryBinder` stands in:
a placement is then real once it is recorded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tessera.cluster.conventions.names import (
    CHECKPOINT_URI_ENV,
    CHECKPOINTABLE_ANNOTATION,
    GPU_MILLI_ANNOTATION,
    GPU_MODELS_ANNOTATION,
    GPU_RESOURCE,
    JOB_ID_LABEL,
    POD_GROUP_API_GROUP,
    POD_GROUP_API_VERSION,
    POD_GROUP_KIND,
    POD_GROUP_LABEL,
    POD_GROUP_PLURAL,
    POD_GROUP_VERSION,
    SCHEDULER_NAME,
    SIM_CHECKPOINT_INTERVAL_ANNOTATION,
    SIM_DURATION_ANNOTATION,
    SIM_STATE_BYTES_ANNOTATION,
    SIM_STEPS_PER_SECOND_ANNOTATION,
    mig_resource_name,
)
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.domain.requirements import PodRef
from tessera.cluster.port import AlreadyBound, Cluster, ClusterError, NotFound
from tessera.contracts.jobs import JobSpec, PodGroupSpec
from tessera.scheduler.domain.plugins.reserve import BindError
from tessera.scheduler.domain.snapshot import Allocation
from tessera.scheduler.service_layer.gangs import job_group_name, job_pod_names

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_SIM_STATE_BYTES",
    "JOB_ID_LABEL",
    "SIM_LABELS",
    "ClusterBinder",
    "InventoryBinder",
    "JobMaterializer",
    "pod_manifest",
]

SIM_LABELS = (SIM_STATE_BYTES_ANNOTATION, SIM_STEPS_PER_SECOND_ANNOTATION, SIM_CHECKPOINT_INTERVAL_ANNOTATION)
"""Job labels that become pod annotations of the same name: the devcluster's simulated trainer reads
them (a real cluster ignores them), so a job spec can size its simulation without a field of its own."""
DEFAULT_SIM_STATE_BYTES = 2**20
"""The simulated state of a checkpointable job that names none: 1 MiB, so a devcluster trainer saves
in milliseconds (the trainer's own default is 4 MiB)."""


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
    """Binding subresource with the ``tessera.io/gpu-assignment`` annotation; Eviction API to undo."""

    def __init__(
        self,
        cluster: Cluster,
        loop: asyncio.AbstractEventLoop,
        uuids: Callable[[str], Mapping[int, str]],
        timeout_s: float = 30.0,
    ) -> None:
        self.cluster = cluster
        self.loop = loop
        self.uuids = uuids
        self.timeout_s = timeout_s
        self._background: set[asyncio.Task[None]] = set()

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
        assignment = DeviceAssignment(allocation.node, shares)
        ref = PodRef.parse(allocation.pod)
        try:
            self._wait(self.cluster.bind(ref, allocation.node, assignment))
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
        call = self._evict(allocation.pod)
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

    async def _evict(self, pod: str) -> None:
        try:
            await self.cluster.evict(PodRef.parse(pod), grace_period_seconds=0)
        except NotFound:
            pass
        except (ClusterError, OSError, TimeoutError) as error:
            # The pod keeps running; it is found bound below quorum at the next rebuild and evicted again.
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


def pod_manifest(
    name: str,
    namespace: str,
    group_name: str,
    job_id: str,
    spec: JobSpec,
    group: PodGroupSpec,
    resume_from: str | None = None,
) -> dict[str, Any]:
    """One pod of an admitted job. A checkpointable job's pods are annotated `tessera.io/checkpointable`
    (with the `tessera.io/sim-*` knobs its labels give, and a small simulated state by default); every
    container of a job that resumes gets `TESSERA_CHECKPOINT_URI`, the checkpoint to restore."""
    requests: dict[str, str] = {"cpu": f"{group.cpu_milli}m", "memory": f"{group.memory_mib}Mi"}
    limits: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if spec.estimated_duration_s is not None:
        annotations[SIM_DURATION_ANNOTATION] = str(spec.estimated_duration_s)
    if spec.checkpointable:
        annotations[CHECKPOINTABLE_ANNOTATION] = "true"
        annotations[SIM_STATE_BYTES_ANNOTATION] = str(DEFAULT_SIM_STATE_BYTES)
        annotations.update({key: spec.labels[key] for key in SIM_LABELS if key in spec.labels})
    env = [{"name": CHECKPOINT_URI_ENV, "value": resume_from}] if resume_from else []
    gpu = group.gpu
    if gpu is not None:
        if gpu.count is not None:
            limits[GPU_RESOURCE] = str(gpu.count)
        elif gpu.milli is not None:
            limits[GPU_RESOURCE] = "1"
            annotations[GPU_MILLI_ANNOTATION] = str(gpu.milli)
        elif gpu.mig_profile is not None:
            limits[mig_resource_name(gpu.mig_profile)] = "1"
        if gpu.models:
            annotations[GPU_MODELS_ANNOTATION] = "|".join(gpu.models)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {POD_GROUP_LABEL: group_name, JOB_ID_LABEL: job_id},
            "annotations": annotations,
        },
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "restartPolicy": "Never",
            "priority": spec.priority,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"requests": requests, "limits": limits},
                    **({"env": env} if env else {}),
                }
            ],
        },
    }


class JobMaterializer:
    """Creates an admitted job's PodGroup and pods on the cluster; creating what exists is a no-op."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self._core: Any = k8s.CoreV1Api(api)
        self._custom: Any = k8s.CustomObjectsApi(api)

    async def ensure(
        self, job_id: str, spec: JobSpec, namespace: str, *, quorum: int, resume_from: str | None = None
    ) -> None:
        """`resume_from`: the checkpoint the job resumes from (admission's `job_admitted`), if any."""
        group_name = job_group_name(job_id, spec)
        pod_group = {
            "apiVersion": POD_GROUP_API_VERSION,
            "kind": POD_GROUP_KIND,
            "metadata": {"name": group_name, "namespace": namespace, "labels": {JOB_ID_LABEL: job_id}},
            "spec": {"minMember": quorum},
        }
        await self._create(
            self._custom.create_namespaced_custom_object,
            POD_GROUP_API_GROUP,
            POD_GROUP_VERSION,
            namespace,
            POD_GROUP_PLURAL,
            pod_group,
        )
        groups = {group.name: group for group in spec.pod_groups}
        for member in job_pod_names(job_id, spec, namespace):
            body = pod_manifest(
                member.name, namespace, group_name, job_id, spec, groups[member.group], resume_from
            )
            await self._create(self._core.create_namespaced_pod, namespace, body)

    async def _create(self, method: Callable[..., Any], *args: Any) -> None:
        def call() -> None:
            try:
                method(*args, _preload_content=False)
            except ApiException as error:
                if error.status != 409:  # already there: a retry after a crash or a requeue
                    raise

        await asyncio.to_thread(call)
