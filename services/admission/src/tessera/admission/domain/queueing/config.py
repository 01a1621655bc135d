"""The validated configuration of queues, cohorts, tenants, flavors and priorities."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypeVar

from tessera.admission.domain.queueing.errors import QueueingValidationError
from tessera.admission.domain.queueing.model import (
    CohortSpec,
    FairSharing,
    FlavorQuotas,
    FlavorSpec,
    PreemptionTiming,
    PriorityClass,
    QueueSpec,
    TenantQueue,
)
from tessera.admission.domain.queueing.resources import is_known_resource
from tessera.admission.domain.tokens import reserved_tenant

_T = TypeVar("_T")


@dataclass(frozen=True)
class QueueingConfig:
    """Everything admission needs to decide, checked once when built (see `build`)."""

    flavors: frozenset[str]
    queues: dict[str, QueueSpec]
    cohorts: dict[str, CohortSpec]
    tenant_queues: dict[str, str] = field(default_factory=dict)
    priority_classes: dict[str, int] = field(default_factory=dict)
    fair_sharing: FairSharing = field(default_factory=FairSharing)
    timing: PreemptionTiming = field(default_factory=PreemptionTiming)
    flavor_specs: dict[str, FlavorSpec] = field(default_factory=dict)
    """Each flavor's capacity type, GPU model, node labels and tolerations, by name."""

    @cached_property
    def spot_flavors(self) -> frozenset[str]:
        return frozenset(name for name, spec in self.flavor_specs.items() if spec.spot)

    @classmethod
    def build(
        cls,
        *,
        flavors: Iterable[str | FlavorSpec],
        queues: Iterable[QueueSpec],
        cohorts: Iterable[CohortSpec] = (),
        tenant_queues: Iterable[TenantQueue] = (),
        priority_classes: Iterable[PriorityClass] = (),
        fair_sharing: FairSharing = FairSharing(),
        timing: PreemptionTiming = PreemptionTiming(),
    ) -> QueueingConfig:
        specs = _unique(
            "flavors", [(f.name, f) if isinstance(f, FlavorSpec) else (f, FlavorSpec(f)) for f in flavors]
        )
        flavor_set = frozenset(specs)
        queue_map = _unique("queues", [(q.name, q) for q in queues])
        cohort_map = _unique("cohorts", [(c.name, c) for c in cohorts])
        # A cohort named only by a queue or a parent reference is implicit, as in Kueue.
        for q in queue_map.values():
            if q.cohort is not None and q.cohort not in cohort_map:
                cohort_map[q.cohort] = CohortSpec(name=q.cohort)
        for c in list(cohort_map.values()):
            if c.parent is not None and c.parent not in cohort_map:
                cohort_map[c.parent] = CohortSpec(name=c.parent)
        for name, q in queue_map.items():
            if q.cohort is not None and q.cohort in queue_map:
                raise QueueingValidationError(f"queues.{name}.cohort", "a cohort cannot share a queue's name")
            _check_flavor_quotas(f"queues.{name}", q.flavors, flavor_set)
            if q.fair_share_weight < 0:
                raise QueueingValidationError(f"queues.{name}.fair_share_weight", "must be >= 0")
        for name, c in cohort_map.items():
            _check_flavor_quotas(f"cohorts.{name}", c.flavors, flavor_set)
        _check_no_cycles(cohort_map)
        tenants = _unique("tenant_queues", [(t.tenant, t.queue) for t in tenant_queues])
        for tenant, queue in tenants.items():
            if (reserved := reserved_tenant(tenant)) is not None:
                raise QueueingValidationError(f"tenant_queues.{tenant}.tenant", reserved)
            if queue not in queue_map:
                raise QueueingValidationError(f"tenant_queues.{tenant}.queue", f"unknown queue {queue!r}")
        priorities = _unique("priority_classes", [(p.name, p.value) for p in priority_classes])
        if fair_sharing.usage_half_life_s < 0:
            raise QueueingValidationError("fair_sharing.usage_half_life_s", "must be >= 0")
        if timing.max_searches_per_queue_per_cycle < 1:
            raise QueueingValidationError("timing.max_searches_per_queue_per_cycle", "must be >= 1")
        for attr in ("checkpoint_grace_s", "default_grace_s", "release_timeout_s"):
            if getattr(timing, attr) < 0:
                raise QueueingValidationError(f"timing.{attr}", "must be >= 0")
        return cls(flavor_set, queue_map, cohort_map, tenants, priorities, fair_sharing, timing, specs)

    def queue_for_tenant(self, tenant: str) -> str:
        try:
            return self.tenant_queues[tenant]
        except KeyError:
            raise QueueingValidationError("tenant", f"no tenant queue maps tenant {tenant!r}") from None

    def priority_of(self, priority_class: str) -> int:
        try:
            return self.priority_classes[priority_class]
        except KeyError:
            raise QueueingValidationError(
                "priority_class", f"unknown priority class {priority_class!r}"
            ) from None


def _unique(field_name: str, items: list[tuple[str, _T]]) -> dict[str, _T]:
    out: dict[str, _T] = {}
    for key, value in items:
        if key in out:
            raise QueueingValidationError(f"{field_name}.{key}", "defined more than once")
        out[key] = value
    return out


def _check_flavor_quotas(where: str, flavors: tuple[FlavorQuotas, ...], known: frozenset[str]) -> None:
    seen: set[str] = set()
    for fq in flavors:
        path = f"{where}.flavors.{fq.flavor}"
        if fq.flavor not in known:
            raise QueueingValidationError(path, f"unknown flavor {fq.flavor!r}")
        if fq.flavor in seen:
            raise QueueingValidationError(path, "flavor listed more than once")
        seen.add(fq.flavor)
        for res, quota in fq.resources.items():
            rpath = f"{path}.{res}"
            if not is_known_resource(res):
                raise QueueingValidationError(rpath, "unknown resource (gpu, gpu-milli, cpu, memory, mig-*)")
            if quota.nominal < 0:
                raise QueueingValidationError(f"{rpath}.nominal", f"quota below zero ({quota.nominal})")
            for limit in ("borrowing_limit", "lending_limit"):
                value = getattr(quota, limit)
                if value is not None and value < 0:
                    raise QueueingValidationError(f"{rpath}.{limit}", f"quota below zero ({value})")
            if quota.lending_limit is not None and quota.lending_limit > quota.nominal:
                raise QueueingValidationError(f"{rpath}.lending_limit", "exceeds the nominal quota")


def _check_no_cycles(cohorts: dict[str, CohortSpec]) -> None:
    for start in cohorts:
        path = [start]
        current = cohorts[start].parent
        while current is not None:
            if current in path:
                loop = " -> ".join([*path[path.index(current) :], current])
                raise QueueingValidationError(f"cohorts.{start}.parent", f"cohort cycle {loop}")
            path.append(current)
            current = cohorts[current].parent
