"""Plain types the queueing domain works on: queues, cohorts, policies and workloads.

These mirror Kueue's ClusterQueue, Cohort, LocalQueue and Workload, trimmed to what Tessera needs.
The service maps its published job spec onto `Workload`; nothing here knows about the wire format.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

from tessera.admission.domain.queueing.affinity import ANY_NODE, NodeRequirement
from tessera.admission.domain.queueing.decisions import PreemptionReason
from tessera.admission.domain.queueing.resources import FlavorResource


class QueueingStrategy(StrEnum):
    """STRICT_FIFO: a head that cannot be admitted blocks its queue.
    BEST_EFFORT_FIFO: a job that does not fit is passed over and the ones behind it are tried."""

    STRICT_FIFO = "strict-fifo"
    BEST_EFFORT_FIFO = "best-effort-fifo"


class WithinQueuePolicy(StrEnum):
    NEVER = "never"
    LOWER_PRIORITY = "lower-priority"


class ReclaimPolicy(StrEnum):
    """Whom a queue may evict in other queues of its cohort to get its nominal quota back."""

    NEVER = "never"
    LOWER_PRIORITY = "lower-priority"
    ANY = "any"


@dataclass(frozen=True, slots=True)
class BorrowWithinCohort:
    """Preempt in other queues while borrowing: only strictly lower priority, and at most
    `max_priority_threshold` when one is set."""

    enabled: bool = False
    max_priority_threshold: int | None = None


@dataclass(frozen=True, slots=True)
class PreemptionPolicy:
    within_queue: WithinQueuePolicy = WithinQueuePolicy.LOWER_PRIORITY
    reclaim_within_cohort: ReclaimPolicy = ReclaimPolicy.ANY
    borrow_within_cohort: BorrowWithinCohort = BorrowWithinCohort()


class CapacityType(StrEnum):
    """What kind of capacity a flavor's nodes are, as Karpenter's `karpenter.sh/capacity-type` says."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"
    """Cheaper, and taken back by the cloud at short notice: for preemptible jobs first."""


@dataclass(frozen=True)
class FlavorSpec:
    """A ResourceFlavor: a kind of GPU capacity, and the node labels (and tolerations) that put a
    pod on it. Admission writes both into the pod templates of the jobs it admits in the flavor."""

    name: str
    gpu_model: str | None = None
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    node_labels: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()

    @property
    def spot(self) -> bool:
        return self.capacity_type is CapacityType.SPOT


@dataclass(frozen=True, slots=True)
class ResourceQuota:
    """Quota of one resource in one flavor. `None` limits mean unlimited (up to the cohort)."""

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None


@dataclass(frozen=True, slots=True)
class FlavorQuotas:
    """The quota a queue (or cohort) holds in one flavor, per resource name."""

    flavor: str
    resources: Mapping[str, ResourceQuota]


@dataclass(frozen=True)
class QueueSpec:
    """A ClusterQueue. `flavors` is ordered: flavor assignment tries them in this order."""

    name: str
    flavors: tuple[FlavorQuotas, ...]
    cohort: str | None = None
    strategy: QueueingStrategy = QueueingStrategy.BEST_EFFORT_FIFO
    preemption: PreemptionPolicy = PreemptionPolicy()
    fair_share_weight: float = 1.0

    @cached_property
    def quotas(self) -> dict[FlavorResource, ResourceQuota]:
        return {(fq.flavor, res): q for fq in self.flavors for res, q in fq.resources.items()}

    @cached_property
    def flavor_order(self) -> tuple[str, ...]:
        return tuple(fq.flavor for fq in self.flavors)


@dataclass(frozen=True, slots=True)
class CohortSpec:
    """A node of the cohort tree. It may hold quota of its own and have limits towards its parent."""

    name: str
    parent: str | None = None
    flavors: tuple[FlavorQuotas, ...] = ()

    @property
    def quotas(self) -> dict[FlavorResource, ResourceQuota]:
        return {(fq.flavor, res): q for fq in self.flavors for res, q in fq.resources.items()}


@dataclass(frozen=True, slots=True)
class TenantQueue:
    """A LocalQueue: routes a tenant's (namespace's) jobs to a queue."""

    tenant: str
    queue: str


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    value: int


@dataclass(frozen=True, slots=True)
class FairSharing:
    """Weighted dominant-resource share over current usage plus a decayed usage history.

    `usage_half_life_s` = 0 keeps no history; `resource_weights` scales a resource's share."""

    enabled: bool = False
    usage_half_life_s: float = 0.0
    resource_weights: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PreemptionTiming:
    """How long victims get. Checkpointable victims get a grace period to save state first;
    past `release_timeout_s` after the grace the preemptor is admitted anyway."""

    checkpoint_grace_s: float = 120.0
    default_grace_s: float = 30.0
    release_timeout_s: float = 60.0
    max_searches_per_queue_per_cycle: int = 32


@dataclass(frozen=True)
class PodGroup:
    """`count` identical pods with per-pod `requests` by resource name.

    `flavors` restricts where the group may go (empty: any flavor of the queue); `node` is what its
    pods require of a node (their nodeSelector and required node affinity)."""

    name: str
    count: int
    requests: Mapping[str, int]
    flavors: frozenset[str] = frozenset()
    node: NodeRequirement = ANY_NODE

    @cached_property
    def total_requests(self) -> dict[str, int]:
        return {res: qty * self.count for res, qty in self.requests.items() if qty}


@dataclass(frozen=True)
class Workload:
    """One job as the queueing domain sees it; `created_at` orders FIFO (seconds, any epoch)."""

    name: str
    queue: str
    pod_groups: tuple[PodGroup, ...]
    priority: int = 0
    created_at: float = 0.0
    preemptible: bool = True
    checkpointable: bool = False

    @cached_property
    def pod_count(self) -> int:
        return sum(g.count for g in self.pod_groups)


@dataclass(slots=True)
class AdmittedWorkload:
    """A workload holding quota: what it uses, where, and since when."""

    workload: Workload
    flavors: tuple[str, ...]
    usage: dict[FlavorResource, int]
    admitted_at: float
    being_preempted: bool = False
    """A preemptor has asked for its eviction; it holds its quota until it reports released."""
    checkpointed_at: float | None = None
    """When it saved its newest checkpoint, if it saved any (the work since then is what evicting it
    loses)."""

    @property
    def work_since(self) -> float:
        """Since when its work would be lost if it were evicted now: its newest checkpoint saved since
        it was admitted, else its admission (a resumed job restored its checkpoint when it started)."""
        if self.checkpointed_at is not None and self.checkpointed_at > self.admitted_at:
            return self.checkpointed_at
        return self.admitted_at

    @property
    def name(self) -> str:
        return self.workload.name

    @property
    def queue(self) -> str:
        return self.workload.queue


@dataclass(slots=True)
class InFlightPreemption:
    """A preemptor waiting for its victims to release their quota."""

    preemptor: str
    victims: tuple[str, ...]
    requested_at: float
    deadline: float
    flavors: tuple[str, ...]
    usage: dict[FlavorResource, int]
    """Quota reserved for the preemptor until it is admitted (counted on top of the victims')."""


@dataclass(frozen=True, slots=True)
class DrainingVictim:
    """An admitted workload asked to leave: by whom, why, and by when."""

    victim: str
    preemptor: str
    reason: PreemptionReason
    deadline: float
