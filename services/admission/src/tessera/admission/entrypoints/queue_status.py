"""What `GET /v1/queues/{name}/status` reports, computed from the same rebuilt view a cycle
decides on (read-only, without the cycle's lock).

Several tenants may share one queue. For a tenant's token the job ids listed (`pending_jobs`,
`admitted_jobs`) are that tenant's alone; the counts (`pending`, `admitted`) and the quota usage stay
the whole queue's, since they are what the tenant waits behind and name no other tenant's job. The
admin sees every job."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, Field

from tessera.admission.domain.model import HOLDS_QUOTA, JobState
from tessera.admission.service_layer.cycle_state import load_cycle_state
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork


class ResourceStatus(BaseModel):
    flavor: str
    resource: str
    nominal: int
    usage: int
    borrowed: int
    lent: int
    """Of this queue's unused nominal quota, how much other queues of the cohort now use."""


class PendingJob(BaseModel):
    id: str
    reason: str | None
    message: str | None


class QueueStatus(BaseModel):
    name: str
    cohort: str | None
    open_mode: bool
    resources: list[ResourceStatus]
    pending: int = Field(description="queued jobs of the whole queue, of every tenant that uses it")
    admitted: int = Field(description="jobs of the whole queue that hold quota, of every tenant")
    pending_jobs: list[PendingJob] = Field(
        description="queued jobs, oldest first; for a tenant's token only that tenant's own"
    )
    admitted_jobs: list[str] = Field(
        description="ids of jobs holding quota; for a tenant's token only its own"
    )


_RESOURCE_ORDER = {"gpu": 0, "gpu-milli": 1, "cpu": 3, "memory": 4}


def _order(flavors: tuple[str, ...], fr: tuple[str, str]) -> tuple[int, int, str]:
    """Flavors in the queue's order; in each, gpu, gpu-milli, MIG profiles, cpu, memory."""
    return flavors.index(fr[0]), _RESOURCE_ORDER.get(fr[1], 2), fr[1]


async def queue_status(
    uow: AdmissionUnitOfWork, name: str, show: int = 50, *, tenant: str | None = None
) -> QueueStatus | None:
    """The queue's status; with `tenant` (a tenant's token) the job lists name only that tenant's
    jobs, the counts stay the queue's."""
    state = await load_cycle_state(uow, datetime.now(UTC))
    spec = state.config.queues.get(name)
    if spec is None:
        return None
    tree = state.engine.tree
    usage = tree.queue_usage(name)
    siblings = [q for q in state.config.queues.values() if q.cohort is not None and q.cohort == spec.cohort]
    resources = []
    for fr, quota in sorted(spec.quotas.items(), key=lambda kv: _order(spec.flavor_order, kv[0])):
        used = usage.get(fr, 0)
        borrowed = max(0, used - quota.nominal)
        spare = max(0, quota.nominal - used)
        if quota.lending_limit is not None:
            spare = min(spare, quota.lending_limit)
        others = sum(
            max(0, tree.queue_usage(q.name).get(fr, 0) - q.quotas[fr].nominal)
            for q in siblings
            if q.name != name and fr in q.quotas
        )
        resources.append(
            ResourceStatus(
                flavor=fr[0],
                resource=fr[1],
                nominal=quota.nominal,
                usage=used,
                borrowed=borrowed,
                lent=min(spare, others),
            )
        )
    mine = [j for j in state.jobs.values() if j.queue == name]
    pending = [j for j in mine if j.state is JobState.QUEUED]
    admitted = [j for j in mine if j.state in HOLDS_QUOTA]
    listed_pending = [j for j in pending if tenant is None or j.tenant == tenant]
    listed_admitted = [j for j in admitted if tenant is None or j.tenant == tenant]
    return QueueStatus(
        name=name,
        cohort=spec.cohort,
        open_mode=state.stored.open_mode,
        resources=resources,
        pending=len(pending),
        admitted=len(admitted),
        pending_jobs=[
            PendingJob(
                id=j.id,
                reason=j.waiting[0] if j.waiting else None,
                message=j.waiting[1] if j.waiting else None,
            )
            for j in listed_pending[:show]
        ],
        admitted_jobs=[j.id for j in listed_admitted[:show]],
    )
