"""Builders for queues, cohorts and jobs, so tests and benchmarks read like the scenario:
`a_queue("a").cohort("c").nominal(gpu=8, flavor="a100")`, `a_job("j").queue("a").gpus(4)`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Self

from tessera.admission.domain.queueing.affinity import ANY_NODE, NodeRequirement
from tessera.admission.domain.queueing.model import (
    BorrowWithinCohort,
    FlavorQuotas,
    PodGroup,
    PreemptionPolicy,
    QueueingStrategy,
    QueueSpec,
    ReclaimPolicy,
    ResourceQuota,
    WithinQueuePolicy,
    Workload,
)
from tessera.admission.domain.queueing.resources import GPU, GPU_MILLI, mig_resource

DEFAULT_FLAVOR = "a100"


class QueueBuilder:
    def __init__(self, name: str) -> None:
        self._name = name
        self._cohort: str | None = None
        self._flavors: dict[str, dict[str, ResourceQuota]] = {}
        self._strategy = QueueingStrategy.BEST_EFFORT_FIFO
        self._preemption = PreemptionPolicy()
        self._weight = 1.0

    def cohort(self, name: str) -> Self:
        self._cohort = name
        return self

    def nominal(
        self,
        flavor: str = DEFAULT_FLAVOR,
        borrowing_limit: int | None = None,
        lending_limit: int | None = None,
        mig: Mapping[str, int] | None = None,
        **resources: int,
    ) -> Self:
        """Quota in one flavor; resource names use `_` for `-` (gpu_milli=4000), MIG slices
        go by profile (mig={"1g.10gb": 7})."""
        quotas = self._flavors.setdefault(flavor, {})
        named = {res.replace("_", "-"): qty for res, qty in resources.items()}
        named.update({mig_resource(profile): qty for profile, qty in (mig or {}).items()})
        for res, qty in named.items():
            quotas[res] = ResourceQuota(qty, borrowing_limit, lending_limit)
        return self

    def strict_fifo(self) -> Self:
        self._strategy = QueueingStrategy.STRICT_FIFO
        return self

    def preemption(
        self,
        within_queue: WithinQueuePolicy = WithinQueuePolicy.LOWER_PRIORITY,
        reclaim: ReclaimPolicy = ReclaimPolicy.ANY,
        borrow_threshold: int | None = None,
        borrow: bool = False,
    ) -> Self:
        self._preemption = PreemptionPolicy(
            within_queue, reclaim, BorrowWithinCohort(borrow, borrow_threshold)
        )
        return self

    def weight(self, weight: float) -> Self:
        self._weight = weight
        return self

    def build(self) -> QueueSpec:
        flavors = tuple(FlavorQuotas(f, dict(r)) for f, r in self._flavors.items())
        return QueueSpec(self._name, flavors, self._cohort, self._strategy, self._preemption, self._weight)


class JobBuilder:
    def __init__(self, name: str) -> None:
        self._name = name
        self._queue = "default"
        self._priority = 0
        self._created_at = 0.0
        self._groups: list[PodGroup] = []
        self._flavors: frozenset[str] = frozenset()
        self._node = ANY_NODE
        self._preemptible = True
        self._checkpointable = False

    def queue(self, name: str) -> Self:
        self._queue = name
        return self

    def priority(self, value: int) -> Self:
        self._priority = value
        return self

    def at(self, created_at: float) -> Self:
        self._created_at = created_at
        return self

    def flavors(self, *names: str) -> Self:
        """Allowed flavors (GPU models) of the pod groups added after this call."""
        self._flavors = frozenset(names)
        return self

    def on_nodes(self, node: NodeRequirement) -> Self:
        """What the pods of the pod groups added after this call require of a node."""
        self._node = node
        return self

    def gpus(self, per_pod: int, pods: int = 1, group: str | None = None, **extra: int) -> Self:
        return self.group(group, pods, **{GPU: per_pod}, **extra)

    def milli(self, per_pod: int, pods: int = 1, group: str | None = None) -> Self:
        return self.group(group, pods, **{GPU_MILLI: per_pod})

    def mig(self, profile: str, pods: int = 1, group: str | None = None) -> Self:
        return self.group(group, pods, **{mig_resource(profile): 1})

    def group(self, name: str | None, pods: int, **requests: int) -> Self:
        requests = {k.replace("_", "-"): v for k, v in requests.items()}
        group_name = name or f"g{len(self._groups)}"
        self._groups.append(PodGroup(group_name, pods, requests, self._flavors, self._node))
        return self

    def not_preemptible(self) -> Self:
        self._preemptible = False
        return self

    def checkpointable(self) -> Self:
        self._checkpointable = True
        return self

    def build(self) -> Workload:
        return Workload(
            self._name,
            self._queue,
            tuple(self._groups),
            self._priority,
            self._created_at,
            self._preemptible,
            self._checkpointable,
        )


def a_queue(name: str) -> QueueBuilder:
    return QueueBuilder(name)


def a_job(name: str) -> JobBuilder:
    return JobBuilder(name)
