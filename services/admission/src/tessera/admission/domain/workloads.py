"""From the published job spec to the queueing domain's `Workload`, and the open configuration
admission uses while no queue is configured. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tessera.admission.domain.model import JobState
from tessera.admission.domain.queueing import (
    FlavorQuotas,
    NodeRequirement,
    PodGroup,
    QueueingConfig,
    QueueingValidationError,
    QueueSpec,
    ResourceQuota,
    Workload,
)
from tessera.admission.domain.queueing.resources import CPU, GPU, GPU_MILLI, MEMORY, mig_resource
from tessera.contracts.jobs import JobSpec

OPEN_QUEUE = "default"
OPEN_FLAVOR = "any"
UNLIMITED = 10**15


@dataclass(slots=True)
class ActiveJob:
    """What the admission cycle reads of a job that is queued or holds quota: its queueing view,
    without its spec or history (the cycle rebuilds the engine from thousands of these)."""

    id: str
    tenant: str
    queue: str
    priority: int
    state: JobState
    submitted_at: datetime
    workload: Mapping[str, Any]
    """Pod groups (`groups_of`) and whether the job may be preempted or checkpointed."""
    flavors: tuple[str, ...] = ()
    admitted_at: datetime | None = None
    waiting: tuple[str, str] | None = None
    preempted_by: str | None = None


def flavor_of_model(model: str) -> str:
    """A GPU model as telemetry and job specs spell it (A100-80GB) to a flavor name (a100-80gb)."""
    return model.strip().lower()


def groups_of(spec: JobSpec) -> list[dict[str, Any]]:
    """Per pod group: pod count, per-pod requests by resource, allowed flavors and, when its template
    has any, its nodeSelector and required node affinity (JSON-friendly)."""
    out = []
    for g in spec.pod_groups:
        requests: dict[str, int] = {CPU: g.cpu_milli, MEMORY: g.memory_mib}
        models: list[str] = []
        if g.gpu is not None:
            models = sorted({flavor_of_model(m) for m in g.gpu.models})
            if g.gpu.count is not None:
                requests[GPU] = g.gpu.count
            elif g.gpu.milli is not None:
                requests[GPU_MILLI] = g.gpu.milli
            elif g.gpu.mig_profile is not None:
                requests[mig_resource(g.gpu.mig_profile)] = 1
        entry: dict[str, Any] = {"name": g.name, "count": g.replicas, "requests": requests, "flavors": models}
        node = NodeRequirement.of_template(g.template)
        if node:  # what its pods require of a node: flavors and nodes that contradict it are not tried
            entry["node"] = node.to_json()
        out.append(entry)
    return out


def to_workload(
    job_id: str,
    queue: str,
    groups: Iterable[Mapping[str, Any]],
    *,
    priority: int,
    created_at: float,
    preemptible: bool,
    checkpointable: bool,
    config: QueueingConfig,
    open_mode: bool,
) -> Workload:
    """Only resources the queue holds quota for are counted (cpu and memory are counted when the
    queue names them); GPU resources always are. A GPU model the job allows allows every flavor of
    that model (on-demand and spot) and the flavor of that name. Allowed models the configuration
    does not know are ignored, unless none is known (then validation names the unknown flavor)."""
    spec = config.queues.get(queue)
    covered = {res for fq in spec.flavors for res in fq.resources} if spec else set()
    pod_groups = []
    for g in groups:
        requests = {
            res: qty
            for res, qty in g["requests"].items()
            if qty and (res not in (CPU, MEMORY) or res in covered)
        }
        wanted = frozenset(g["flavors"])
        if open_mode:
            allowed: frozenset[str] = frozenset()
        else:
            known = {
                name
                for name, flavor in config.flavor_specs.items()
                if name in wanted or flavor_of_model(flavor.gpu_model or name) in wanted
            }
            allowed = frozenset(known) or wanted
        node = NodeRequirement.stored(g.get("node"))
        pod_groups.append(PodGroup(g["name"], int(g["count"]), requests, allowed, node))
    return Workload(job_id, queue, tuple(pod_groups), priority, created_at, preemptible, checkpointable)


def open_config(resources: Iterable[str] = ()) -> QueueingConfig:
    """One unlimited queue every tenant maps to, in one flavor that stands for any GPU: jobs are
    admitted in FIFO order as long as the cluster's free shape can hold them."""
    names = {GPU, GPU_MILLI, *(r for r in resources if r.startswith("mig-"))}
    quotas = FlavorQuotas(OPEN_FLAVOR, {r: ResourceQuota(UNLIMITED) for r in sorted(names)})
    return QueueingConfig.build(flavors=[OPEN_FLAVOR], queues=[QueueSpec(OPEN_QUEUE, (quotas,))])


def tenant_queue(config: QueueingConfig, tenant: str, requested: str, open_mode: bool) -> str:
    """The queue a tenant's job goes to. The job's `queue` is either left as `default` (the
    tenant's own queue) or names that same queue; raises `QueueingValidationError` otherwise."""
    if open_mode:
        return OPEN_QUEUE
    if requested != OPEN_QUEUE and requested not in config.queues:
        raise QueueingValidationError("queue", f"unknown queue {requested!r}")
    own = config.queue_for_tenant(tenant)
    if requested not in (OPEN_QUEUE, own):
        raise QueueingValidationError(
            "queue", f"tenant {tenant!r} may submit only to its own queue {own!r}, not {requested!r}"
        )
    return own
