"""Pure queueing domain of admission: quotas over a cohort tree, flavor assignment, fair share,
preemption and the admission cycle. No I/O; the service persists and publishes the decisions."""

from tessera.admission.domain.queueing.config import QueueingConfig
from tessera.admission.domain.queueing.decisions import (
    Admit,
    CycleResult,
    Decision,
    Preempt,
    PreemptionReason,
    Wait,
    WaitReason,
)
from tessera.admission.domain.queueing.engine import QueueingEngine
from tessera.admission.domain.queueing.errors import (
    InvalidTransition,
    QueueingValidationError,
    UnknownWorkload,
)
from tessera.admission.domain.queueing.lifecycle import JobLifecycle, JobState, Transition
from tessera.admission.domain.queueing.model import (
    AdmittedWorkload,
    BorrowWithinCohort,
    CohortSpec,
    FairSharing,
    FlavorQuotas,
    InFlightPreemption,
    PodGroup,
    PreemptionPolicy,
    PreemptionTiming,
    PriorityClass,
    QueueingStrategy,
    QueueSpec,
    ReclaimPolicy,
    ResourceQuota,
    TenantQueue,
    WithinQueuePolicy,
    Workload,
)
from tessera.admission.domain.queueing.shape import FreeShapeOracle, NodeFree, Placement, ShapeOracle

__all__ = [
    "Admit",
    "AdmittedWorkload",
    "BorrowWithinCohort",
    "CohortSpec",
    "CycleResult",
    "Decision",
    "FairSharing",
    "FlavorQuotas",
    "FreeShapeOracle",
    "InFlightPreemption",
    "InvalidTransition",
    "JobLifecycle",
    "JobState",
    "NodeFree",
    "Placement",
    "PodGroup",
    "Preempt",
    "PreemptionPolicy",
    "PreemptionReason",
    "PreemptionTiming",
    "PriorityClass",
    "QueueSpec",
    "QueueingConfig",
    "QueueingEngine",
    "QueueingStrategy",
    "QueueingValidationError",
    "ReclaimPolicy",
    "ResourceQuota",
    "ShapeOracle",
    "TenantQueue",
    "Transition",
    "UnknownWorkload",
    "Wait",
    "WaitReason",
    "WithinQueuePolicy",
    "Workload",
]
