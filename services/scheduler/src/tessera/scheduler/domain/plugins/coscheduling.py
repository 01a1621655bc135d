"""Coscheduling: gang quorum at Permit, a quick whole-gang capacity check at PreFilter.

As in scheduler-plugins' ``pkg/coscheduling``: a reserved member waits in Permit until
``min_available`` members are reserved, then every waiting member is allowed together; if the wait
outlives the gang's timeout, the gang scheduler rejects every member and releases its reservations.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.scheduler.domain.framework.cycle_state import CycleState
from tessera.scheduler.domain.framework.pod import PodSpec
from tessera.scheduler.domain.framework.status import Reason, Status
from tessera.scheduler.domain.gang.registry import GangRegistry
from tessera.scheduler.domain.plugins.args import CoschedulingArgs
from tessera.scheduler.domain.snapshot import MILLI_PER_GPU, Snapshot


@dataclass(frozen=True)
class Coscheduling:
    registry: GangRegistry
    args: CoschedulingArgs = field(default_factory=CoschedulingArgs)
    name: str = "Coscheduling"

    def pre_filter(self, state: CycleState, pod: PodSpec, snapshot: Snapshot) -> Status:
        """Reject at once when the whole GPUs still needed for quorum exceed every free GPU in the cluster."""
        if pod.gang not in self.registry:
            return Status.unresolvable(f"{Reason.GANG_INCOMPLETE}: gang {pod.gang} is not registered")
        shortfall = self.registry.spec(pod.gang).min_available - self.registry.placed(pod.gang)
        if shortfall <= 0:
            return Status.success()
        demands = sorted(p.gpu_count for p in self.registry.pending(pod.gang) if p.gpu_milli == MILLI_PER_GPU)
        needed = sum(demands[:shortfall])
        free = snapshot.totals.free_whole_gpus
        if needed > free:
            return Status.unschedulable(f"{Reason.GANG_EXCEEDS_FREE_CAPACITY} ({needed} > {free})")
        return Status.success()

    def permit(self, state: CycleState, pod: PodSpec, node: str) -> tuple[Status, float]:
        if self.registry.quorum_met(pod.gang):
            return Status.success(), 0.0
        spec = self.registry.spec(pod.gang)
        timeout = spec.timeout_s if spec.timeout_s is not None else self.args.permit_waiting_time_s
        placed = self.registry.placed(pod.gang)
        return Status.wait(f"{Reason.GANG_INCOMPLETE}: {placed} of {spec.min_available} placed"), timeout
