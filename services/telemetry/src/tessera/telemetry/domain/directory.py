"""Which job, queue and tenant a pod's GPU use is billed to. Pure.

Admission announces each job with its tenant and queue (`job_accepted`, `job_admitted`); the
scheduler's `gang_placed` names the job's pods (by namespace and name) and the share of each GPU each
was given. Pods are told apart by namespace and name: two tenants may run pods of the same name in
their namespaces. A placement without a namespace (an event from before the scheduler sent it) is
matched by the pod's name alone, in any namespace, unless a placement names the pod's namespace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import count

from tessera.telemetry.domain.attribution import UNKNOWN


@dataclass(frozen=True, slots=True)
class JobRef:
    """What a pod's readings are billed to."""

    job_id: str
    queue: str
    tenant: str


UNKNOWN_JOB = JobRef(UNKNOWN, UNKNOWN, UNKNOWN)

#: a pod: (namespace, name)
PodKey = tuple[str, str]


def billed_to(jobs: Mapping[PodKey, JobRef], namespace: str, pod: str) -> JobRef | None:
    """What the pod `namespace/pod` is billed to: its placement's job, else that of a placement of
    its name without a namespace (sent before placements named one), else None."""
    return jobs.get((namespace, pod)) or jobs.get(("", pod))


_PLACEMENTS = count(1)


@dataclass(frozen=True)
class PlacedPod:
    pod: str
    job_id: str
    node: str
    #: GPU uuid -> milli-GPU placed
    gpus: Mapping[str, int]
    #: "" when the placement did not say: the pod is then matched by its name in any namespace
    namespace: str = ""

    @property
    def key(self) -> PodKey:
        return (self.namespace, self.pod)


@dataclass
class JobDirectory:
    jobs: dict[str, JobRef] = field(default_factory=dict)
    #: (namespace, name) -> the pod's placement
    pods: dict[PodKey, PlacedPod] = field(default_factory=dict)
    #: changes whenever a pod is placed or ends (what `placed_milli` answers may then differ); never
    #: the same number in two directories (one loaded after a restart replaces the ledger's)
    placements: int = field(default_factory=lambda: next(_PLACEMENTS))
    _refs: dict[PodKey, JobRef] | None = None

    def add_job(self, job_id: str, tenant: str, queue: str) -> None:
        self.jobs[job_id] = JobRef(job_id, queue, tenant)
        self._refs = None

    def place(self, pods: Iterable[PlacedPod]) -> None:
        for p in pods:
            self.pods[p.key] = p
        self.placements = next(_PLACEMENTS)
        self._refs = None

    def end(self, job_id: str, pod_names: Iterable[str] | None = None) -> None:
        """The job's pods (all, or those of these names) let their GPUs go. A pod of the same name
        placed for another job (in another namespace, or since) stays."""
        names = None if pod_names is None else set(pod_names)
        ended = [p for p in self.pods.values() if p.job_id == job_id and (names is None or p.pod in names)]
        for p in ended:
            del self.pods[p.key]
        self.placements = next(_PLACEMENTS)
        self._refs = None

    def _placed(self, namespace: str, pod: str) -> PlacedPod | None:
        return self.pods.get((namespace, pod)) or self.pods.get(("", pod))

    def job_of(self, namespace: str, pod: str) -> JobRef | None:
        return billed_to(self.refs(), namespace, pod)

    def refs(self) -> dict[PodKey, JobRef]:
        """(namespace, name) -> what the pod is billed to, for every placed pod (kept until the
        directory changes); look a pod up with `billed_to`."""
        if self._refs is None:
            self._refs = {
                key: self.jobs.get(p.job_id) or JobRef(p.job_id, "unknown", "unknown")
                for key, p in self.pods.items()
            }
        return self._refs

    def placed_milli(self, namespace: str, pod: str, gpu_uuid: str) -> int | None:
        placed = self._placed(namespace, pod)
        return None if placed is None else placed.gpus.get(gpu_uuid)
