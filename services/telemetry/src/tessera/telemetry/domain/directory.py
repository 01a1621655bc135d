"""Which job, queue and tenant a pod's GPU use is billed to. Pure.

Admission announces each job with its tenant and queue (`job_accepted`, `job_admitted`); the
scheduler's `gang_placed` names the job's pods (by name) and the share of each GPU each was given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import count

from tessera.telemetry.domain.usage import JobRef

_PLACEMENTS = count(1)


@dataclass(frozen=True)
class PlacedPod:
    pod: str
    job_id: str
    node: str
    #: GPU uuid -> milli-GPU placed
    gpus: Mapping[str, int]


@dataclass
class JobDirectory:
    jobs: dict[str, JobRef] = field(default_factory=dict)
    pods: dict[str, PlacedPod] = field(default_factory=dict)
    #: changes whenever a pod is placed or ends (what `placed_milli` answers may then differ); never
    #: the same number in two directories (one loaded after a restart replaces the ledger's)
    placements: int = field(default_factory=lambda: next(_PLACEMENTS))
    _refs: dict[str, JobRef] | None = None

    def add_job(self, job_id: str, tenant: str, queue: str) -> None:
        self.jobs[job_id] = JobRef(job_id, queue, tenant)
        self._refs = None

    def place(self, pods: Iterable[PlacedPod]) -> None:
        for p in pods:
            self.pods[p.pod] = p
        self.placements = next(_PLACEMENTS)
        self._refs = None

    def end(self, pod_names: Iterable[str]) -> None:
        for name in pod_names:
            self.pods.pop(name, None)
        self.placements = next(_PLACEMENTS)
        self._refs = None

    def job_of(self, pod: str) -> JobRef | None:
        placed = self.pods.get(pod)
        if placed is None:
            return None
        return self.jobs.get(placed.job_id) or JobRef(placed.job_id, "unknown", "unknown")

    def refs(self) -> dict[str, JobRef]:
        """pod name -> what it is billed to, for every placed pod (kept until the directory changes)."""
        if self._refs is None:
            out = {}
            for name in self.pods:
                ref = self.job_of(name)
                if ref is not None:
                    out[name] = ref
            self._refs = out
        return self._refs

    def placed_milli(self, pod: str, gpu_uuid: str) -> int | None:
        placed = self.pods.get(pod)
        return None if placed is None else placed.gpus.get(gpu_uuid)
