"""What the service layer needs from storage, one protocol per repository. The Postgres
repositories in `adapters/` implement them; unit tests install in-memory ones."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from tessera.admission.domain.documents import StoredConfig
from tessera.admission.domain.flavor_placement import FlavorPlacement
from tessera.admission.domain.job_conditions import Condition, ConditionsDue
from tessera.admission.domain.kube_objects import JobObjects
from tessera.admission.domain.model import Job, JobCheckpoint
from tessera.admission.domain.queueing import InFlightPreemption
from tessera.admission.domain.queueing.model import DrainingVictim
from tessera.admission.domain.queueing.resources import FlavorResource
from tessera.admission.domain.reconcile import ClusterView
from tessera.admission.domain.tokens import TokenRecord
from tessera.admission.domain.workload_sync import Applied, Owner, WorkloadDue
from tessera.admission.domain.workloads import ActiveJob


class Jobs(Protocol):
    """Jobs it loads or adds are tracked by the unit of work, which publishes their events."""

    async def add(self, job: Job, workload: Mapping[str, Any] | None = None) -> bool: ...
    async def get(self, job_id: str, *, for_update: bool = False) -> Job | None: ...
    async def get_many(self, ids: Sequence[str]) -> dict[str, Job]:
        """In the order of `ids`, which is the order their events are published in."""

    async def active(self) -> list[ActiveJob]: ...
    async def count_by_state(self) -> dict[str, int]:
        """Every job held, ended ones included, by state."""

    async def save(self, job: Job) -> None: ...
    async def save_all(self, changed: Iterable[Job]) -> None: ...
    async def list(
        self,
        *,
        tenant: str | None = None,
        state: str | None = None,
        queue: str | None = None,
        limit: int = 100,
    ) -> list[Job]: ...


class Checkpoints(Protocol):
    """The checkpoints jobs saved (a job loaded through `Jobs` comes with its newest one)."""

    async def add(self, job_id: str, checkpoint: JobCheckpoint, request_id: str | None = None) -> bool:
        """Record a checkpoint of a known job; False when it is recorded already."""

    async def of_jobs(self, job_ids: Collection[str], limit: int = 100) -> dict[str, list[JobCheckpoint]]:
        """Each job's checkpoints, newest first, at most `limit` per job."""

    async def latest_times(self, job_ids: Collection[str]) -> dict[str, datetime]:
        """When each job that saved any saved its newest checkpoint."""


class QueueingConfigs(Protocol):
    async def load(self) -> StoredConfig: ...
    async def save(self, before: StoredConfig, after: StoredConfig) -> None: ...


class Tokens(Protocol):
    async def add(
        self, sha256: str, tenant: str | None, admin: bool = False, expires_at: datetime | None = None
    ) -> TokenRecord: ...
    async def find(self, sha256: str) -> TokenRecord | None: ...
    async def list(self, *, tenant: str | None = None) -> list[TokenRecord]: ...
    async def revoke(self, id_: str, at: datetime) -> TokenRecord | None:
        """The token named ``id_``, revoked at ``at`` unless it was before; None when there is none."""


class IdempotencyKeys(Protocol):
    async def find(self, tenant: str, key: str) -> tuple[str, str] | None:
        """(body_sha256, job_id) of the tenant's key, or None."""

    async def claim(self, tenant: str, key: str, body_sha256: str, job_id: str) -> bool:
        """Record the key's job; False when a concurrent submission recorded the key first."""


class Inventory(Protocol):
    async def replace_source(
        self,
        source: str,
        nodes: Mapping[str, Sequence[Mapping[str, Any]]],
        at: datetime,
        labels: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """`source` now reports exactly `nodes` (name -> its GPUs), with each node's labels."""

    async def nodes(self) -> list[tuple[str, list[dict[str, Any]]]]: ...
    async def node_labels(self) -> dict[str, dict[str, str]]:
        """Each node's labels, as its source last reported them."""

    async def record_placement(
        self, job_id: str, pods: Sequence[Mapping[str, Any]], at: datetime
    ) -> None: ...
    async def release_placement(self, job_id: str) -> None: ...
    async def placements_of(self, job_ids: Collection[str]) -> dict[str, list[dict[str, Any]]]: ...


class CycleRecords(Protocol):
    async def preemptions(self) -> tuple[list[InFlightPreemption], list[DrainingVictim]]: ...
    async def save_preemptions(
        self, inflight: Sequence[InFlightPreemption], draining: Iterable[DrainingVictim]
    ) -> None: ...
    async def fair_share(self) -> dict[str, tuple[dict[FlavorResource, float], datetime]]: ...
    async def save_fair_share(
        self, history: Mapping[str, Mapping[FlavorResource, float]], sampled_at: datetime
    ) -> None: ...


class CycleGate(Protocol):
    """One admission cycle at a time, and changes that wait for it (see `adapters.cycle_records`)."""

    async def lock(self) -> None: ...
    async def hold_off(self) -> None: ...
    async def job_events_in_turn(self) -> None: ...
    async def mark_changed(self) -> None: ...
    async def change_mark(self) -> int: ...


class Workloads(Protocol):
    """The Kubernetes objects of each job, as admission last made sure of them."""

    async def due(self, limit: int = 100) -> list[WorkloadDue]: ...
    async def record(
        self,
        job_id: str,
        namespace: str,
        objects: Sequence[tuple[str, str]],
        applied: Applied,
        at: datetime,
        note: str = "",
        owner: Owner = Owner.TESSERA,
    ) -> None: ...
    async def user_owned(self, kind: str | None = None) -> list[tuple[str, str, str]]: ...
    async def conditions_due(self, limit: int = 100) -> list[ConditionsDue]: ...
    async def mark_reported(self, job_id: str, updated_at: datetime) -> None: ...
    async def of_job(self, job_id: str) -> tuple[str, list[tuple[str, str]], Applied, str] | None: ...
    async def forget(self, job_id: str) -> None:
        """Drop what admission made sure of for the job, so the next round makes its objects again."""
        ...


class WorkloadError(RuntimeError):
    """The cluster refused or did not answer a change to a job's objects; it is tried again."""


class WorkloadGone(WorkloadError):
    """A job's object is no longer on the cluster (deleted by its owner)."""


class WorkloadCluster(Protocol):
    """Kubernetes, for the objects that run jobs. Each call is idempotent: creating what exists,
    suspending what is suspended or deleting what is gone changes nothing. Raises `WorkloadError`."""

    async def create(self, objects: JobObjects) -> None: ...
    async def set_suspended(
        self,
        namespace: str,
        jobs: Sequence[str],
        suspended: bool,
        placements: Mapping[str, FlavorPlacement] | None = None,
    ) -> list[str]:
        """Returns the Jobs it changed (those not already so). A Job it unsuspends that has a
        placement (by Job name) gets it in its pod template in the same change."""
        ...

    async def delete(self, namespace: str, objects: Sequence[tuple[str, str]]) -> None: ...
    async def set_conditions(
        self, namespace: str, job: str, conditions: Sequence[Condition]
    ) -> list[Condition]:
        """Write ``conditions`` into the Job's `status.conditions` (its other conditions kept); returns
        those that changed. Raises `WorkloadGone` when the Job is gone."""
        ...

    async def event(
        self,
        namespace: str,
        job: str,
        kind: str,
        reason: str,
        message: str,
        involved: str = "Job",
        name: str | None = None,
    ) -> None:
        """A core/v1 Event on the Job (``kind`` Normal or Warning), as `kubectl describe job` lists it,
        or on the object of kind ``involved`` (a Pod) of that name. ``name``: the Event's own name,
        for an Event told once however often it is asked for (one of that name is left as it is)."""
        ...

    async def labelled_pods(self) -> list[dict[str, Any]]:
        """Every Pod labelled `tessera.io/queue` and a Tessera job id, in every namespace."""
        ...

    async def release_pods(
        self, namespace: str, pods: Sequence[str], placement: FlavorPlacement | None = None
    ) -> list[str]:
        """Remove admission's scheduling gate from the pods, in the same patch putting them on
        ``placement``'s nodes; returns those it changed (those still gated). Raises `WorkloadGone`
        when a pod is gone."""
        ...

    async def set_pod_conditions(
        self, namespace: str, pod: str, conditions: Sequence[Condition]
    ) -> list[Condition]:
        """As `set_conditions`, on a Pod's `status.conditions`."""
        ...

    async def set_jobset_conditions(
        self, namespace: str, name: str, conditions: Sequence[Condition]
    ) -> list[Condition]:
        """As `set_conditions`, on a JobSet's `status.conditions` (its `metav1.Condition`s, through its
        status subresource; the JobSet controller's own kept). Raises `WorkloadGone` when it is gone."""
        ...

    async def priority_classes(self) -> list[dict[str, Any]]:
        """Every scheduling.k8s.io/v1 PriorityClass, as the API serves it (none where it serves none)."""
        ...

    async def labelled_jobsets(self) -> list[dict[str, Any]]:
        """Every JobSet labelled `tessera.io/queue`, in every namespace."""
        ...

    async def set_jobset_suspended(
        self, namespace: str, name: str, suspended: bool, placements: Sequence[FlavorPlacement | None]
    ) -> bool:
        """Suspend or unsuspend a JobSet, putting each replicated job's pods on its placement (in
        order) when it unsuspends; True when it changed. Raises `WorkloadGone` when it is gone."""
        ...

    async def labelled_jobs(self) -> list[dict[str, Any]]:
        """Every batch/v1 Job labelled `tessera.io/queue`, in every namespace, as the API serves it."""
        ...

    async def job_views(self) -> dict[str, ClusterView]:
        """Job id -> its pods' phases and how many batch/v1 Jobs carry its id, in every namespace."""
        ...
