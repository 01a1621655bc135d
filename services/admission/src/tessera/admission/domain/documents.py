"""The queueing configuration as operators write it (REST bodies and `tessera queues apply` YAML),
and its mapping onto the pure queueing model. Pure: pydantic only, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from tessera.admission.domain.queueing import (
    BorrowWithinCohort,
    CapacityType,
    CohortSpec,
    FairSharing,
    FlavorQuotas,
    FlavorSpec,
    PreemptionPolicy,
    PreemptionTiming,
    PriorityClass,
    QueueingConfig,
    QueueingStrategy,
    QueueSpec,
    ReclaimPolicy,
    ResourceQuota,
    TenantQueue,
    WithinQueuePolicy,
)
from tessera.admission.domain.tokens import reserved_tenant

NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
Name = Annotated[str, Field(pattern=NAME, max_length=63)]
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY = rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$"
"""A Kubernetes label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63."""
LabelKey = Annotated[str, StringConstraints(pattern=LABEL_KEY, max_length=317)]
LabelValue = Annotated[str, StringConstraints(pattern=rf"^({_LABEL_NAME})?$", max_length=63)]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class QuotaDoc(_Doc):
    """Quota of one resource; limits left out mean unlimited (up to the cohort)."""

    nominal: int = Field(description="guaranteed amount (gpu: GPUs, gpu-milli, cpu: milli-CPU, memory: MiB)")
    borrowing_limit: int | None = Field(None, description="most it may borrow beyond nominal")
    lending_limit: int | None = Field(None, description="most of its nominal others may borrow")


class FlavorQuotaDoc(_Doc):
    flavor: Name = Field(description="a GPU flavor such as a100-80gb or t4")
    resources: dict[str, int | QuotaDoc] = Field(
        description="per resource (gpu, gpu-milli, mig-<profile>, cpu, memory): a nominal or a quota",
        examples=[{"gpu": 8, "cpu": {"nominal": 256000}}],
    )

    def to_domain(self) -> FlavorQuotas:
        resources = {}
        for res, q in self.resources.items():
            quota = QuotaDoc(nominal=q) if isinstance(q, int) else q
            resources[res] = ResourceQuota(quota.nominal, quota.borrowing_limit, quota.lending_limit)
        return FlavorQuotas(self.flavor, resources)


class BorrowWithinCohortDoc(_Doc):
    enabled: bool = False
    max_priority_threshold: int | None = None


class PreemptionDoc(_Doc):
    within_queue: WithinQueuePolicy = WithinQueuePolicy.LOWER_PRIORITY
    reclaim_within_cohort: ReclaimPolicy = ReclaimPolicy.ANY
    borrow_within_cohort: BorrowWithinCohortDoc = BorrowWithinCohortDoc()


class TolerationDoc(_Doc):
    """A Kubernetes toleration, added to the pods of jobs admitted in the flavor."""

    key: LabelKey | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: LabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(None, ge=0, description="NoExecute only: how long it stays")

    def manifest(self) -> dict[str, Any]:
        """As a pod spec's `tolerations` item (camelCase, unset fields left out)."""
        out: dict[str, Any] = {"operator": self.operator}
        for attr, name in (("key", "key"), ("value", "value"), ("effect", "effect")):
            if getattr(self, attr) is not None:
                out[name] = getattr(self, attr)
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


class FlavorDoc(_Doc):
    """A ResourceFlavor, as Kueue's: a kind of GPU capacity and the nodes that are it. Prices are not
    here: telemetry's price file holds each flavor's on-demand and spot price per GPU-hour, and prices
    a GPU-hour as spot when its node's labels say so (`karpenter.sh/capacity-type: spot`, ...)."""

    name: Name
    gpu_model: str | None = Field(None, description="the GPU model telemetry reports, e.g. A100-80GB")
    capacity_type: CapacityType = Field(
        CapacityType.ON_DEMAND,
        description="spot flavors are tried first for preemptible jobs, and never for the others "
        "unless their queue offers nothing else",
    )
    node_labels: dict[LabelKey, LabelValue] = Field(
        {},
        max_length=32,
        description="the labels of the flavor's nodes: a pod admitted in the flavor gets them as its "
        "nodeSelector, and admission counts a node in the flavor when it has them all",
        examples=[{"karpenter.sh/capacity-type": "spot"}],
    )
    tolerations: list[TolerationDoc] = Field(
        [],
        max_length=16,
        description="added to the pods admitted in the flavor (e.g. for tainted spot nodes)",
    )

    def to_domain(self) -> FlavorSpec:
        return FlavorSpec(
            self.name,
            self.gpu_model,
            self.capacity_type,
            dict(self.node_labels),
            tuple(t.manifest() for t in self.tolerations),
        )


class CohortDoc(_Doc):
    name: Name
    parent: Name | None = None
    quotas: list[FlavorQuotaDoc] = []

    def to_domain(self) -> CohortSpec:
        return CohortSpec(self.name, self.parent, tuple(q.to_domain() for q in self.quotas))


class QueueDoc(_Doc):
    name: Name
    cohort: Name | None = None
    quotas: list[FlavorQuotaDoc] = Field(description="per flavor, tried in this order")
    strategy: QueueingStrategy = QueueingStrategy.BEST_EFFORT_FIFO
    preemption: PreemptionDoc = PreemptionDoc()
    fair_share_weight: float = 1.0

    def to_domain(self) -> QueueSpec:
        p = self.preemption
        policy = PreemptionPolicy(
            p.within_queue,
            p.reclaim_within_cohort,
            BorrowWithinCohort(p.borrow_within_cohort.enabled, p.borrow_within_cohort.max_priority_threshold),
        )
        flavors = tuple(q.to_domain() for q in self.quotas)
        return QueueSpec(self.name, flavors, self.cohort, self.strategy, policy, self.fair_share_weight)


class TenantQueueDoc(_Doc):
    tenant: Name
    queue: Name


class PriorityClassDoc(_Doc):
    name: Name
    value: int = Field(
        ge=-(2**31), le=1_000_000_000, description="as Kubernetes': at most one billion for user classes"
    )
    description: str = Field("", max_length=1024, pattern=r"^[^\x00]*$")


class FairSharingDoc(_Doc):
    enabled: bool = False
    usage_half_life_s: float = 0.0
    resource_weights: dict[str, float] = {}


class TimingDoc(_Doc):
    checkpoint_grace_s: float = 120.0
    default_grace_s: float = 30.0
    release_timeout_s: float = 60.0


class QueueingDocument(_Doc):
    """Everything `tessera queues apply` writes; absent sections are left as they are."""

    flavors: list[FlavorDoc] = []
    cohorts: list[CohortDoc] = []
    queues: list[QueueDoc] = []
    tenant_queues: list[TenantQueueDoc] = []
    priority_classes: list[PriorityClassDoc] = []
    fair_sharing: FairSharingDoc | None = None
    preemption_timing: TimingDoc | None = None


def build_config(
    flavors: list[FlavorDoc],
    cohorts: list[CohortDoc],
    queues: list[QueueDoc],
    tenant_queues: list[TenantQueueDoc],
    priority_classes: list[PriorityClassDoc],
    fair_sharing: FairSharingDoc | None,
    timing: TimingDoc | None,
) -> QueueingConfig:
    """Check and build; raises `QueueingValidationError` naming the field."""
    fs = fair_sharing or FairSharingDoc()
    t = timing or TimingDoc()
    return QueueingConfig.build(
        flavors=[f.to_domain() for f in flavors],
        queues=[q.to_domain() for q in queues],
        cohorts=[c.to_domain() for c in cohorts],
        tenant_queues=[TenantQueue(tq.tenant, tq.queue) for tq in tenant_queues],
        priority_classes=[PriorityClass(p.name, p.value) for p in priority_classes],
        fair_sharing=FairSharing(fs.enabled, fs.usage_half_life_s, dict(fs.resource_weights)),
        timing=PreemptionTiming(t.checkpoint_grace_s, t.default_grace_s, t.release_timeout_s),
    )


@dataclass(frozen=True)
class SkippedEntry:
    """A stored entry the configuration is built without, why, and how to fix it."""

    field: str
    reason: str
    fix: str
    entry: dict[str, Any]
    """The entry as stored."""


@dataclass
class StoredConfig:
    """The whole stored configuration, as documents; `build()` checks it."""

    flavors: list[FlavorDoc] = field(default_factory=list)
    cohorts: list[CohortDoc] = field(default_factory=list)
    queues: list[QueueDoc] = field(default_factory=list)
    tenant_queues: list[TenantQueueDoc] = field(default_factory=list)
    priority_classes: list[PriorityClassDoc] = field(default_factory=list)
    fair_sharing: FairSharingDoc | None = None
    timing: TimingDoc | None = None

    @property
    def open_mode(self) -> bool:
        """No queue is configured: admission admits every valid job (see ADR 0007)."""
        return not self.queues

    def skipped(self) -> list[SkippedEntry]:
        """Stored entries that a rule made since they were stored refuses on their own (a tenant queue
        for a reserved tenant name): `usable` leaves them out, so one such row does not stop the
        configuration of every other queue and tenant."""
        out = []
        for tq in self.tenant_queues:
            if (reserved := reserved_tenant(tq.tenant)) is not None:
                fix = (
                    f"delete it (DELETE /v1/tenant-queues/{tq.tenant}) and map the tenant's jobs "
                    f"under another tenant name"
                )
                out.append(SkippedEntry(f"tenant_queues.{tq.tenant}.tenant", reserved, fix, dump(tq)))
        return out

    def usable(self) -> StoredConfig:
        """This configuration without its `skipped` entries: what admission decides on."""
        kept = [tq for tq in self.tenant_queues if reserved_tenant(tq.tenant) is None]
        return replace(self, tenant_queues=kept)

    def build(self) -> QueueingConfig:
        """Check all of it, `skipped` entries included; raises `QueueingValidationError`."""
        return build_config(
            self.flavors,
            self.cohorts,
            self.queues,
            self.tenant_queues,
            self.priority_classes,
            self.fair_sharing,
            self.timing,
        )

    def merged(self, doc: QueueingDocument) -> StoredConfig:
        """This configuration with `doc` applied on top (by name), not yet checked."""

        def merge(old: list[Any], new: list[Any], key: str) -> list[Any]:
            out = {getattr(o, key): o for o in old}
            out.update({getattr(n, key): n for n in new})
            return list(out.values())

        return StoredConfig(
            merge(self.flavors, doc.flavors, "name"),
            merge(self.cohorts, doc.cohorts, "name"),
            merge(self.queues, doc.queues, "name"),
            merge(self.tenant_queues, doc.tenant_queues, "tenant"),
            merge(self.priority_classes, doc.priority_classes, "name"),
            doc.fair_sharing or self.fair_sharing,
            doc.preemption_timing or self.timing,
        )


def dump(doc: BaseModel) -> dict[str, Any]:
    return doc.model_dump(mode="json", exclude_none=False)
