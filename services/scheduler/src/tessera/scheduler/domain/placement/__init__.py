"""Placement: where a pod (whole GPUs, a share of one GPU, or none) goes in an array-backed cluster state.

Every policy implements `choose(state, pod) -> Placement | None` and never mutates the state; the
caller applies the decision. The benchmark and the live scheduler run the same code.
"""

from tessera.scheduler.domain.placement.choice import random_ranks
from tessera.scheduler.domain.placement.fgd import FGDPolicy
from tessera.scheduler.domain.placement.fragmentation import FragmentationModel, TypicalPod, typical_pods
from tessera.scheduler.domain.placement.model import (
    MILLI_PER_GPU,
    NodeSpec,
    Placement,
    PlacementInputError,
    PodShape,
)
from tessera.scheduler.domain.placement.observed_workload import (
    OPENB_TYPICAL_WORKLOAD,
    placed_shape,
    typical_workload,
)
from tessera.scheduler.domain.placement.policies import (
    BestFitPolicy,
    DotProdPolicy,
    PackingPolicy,
    PlacementPolicy,
    RandomPolicy,
)
from tessera.scheduler.domain.placement.registry import POLICY_FACTORIES, make_policy, place_all
from tessera.scheduler.domain.placement.state import ClusterState
from tessera.scheduler.domain.placement.tessera_policy import TesseraPolicy, WorkloadProfile

__all__ = [
    "MILLI_PER_GPU",
    "OPENB_TYPICAL_WORKLOAD",
    "POLICY_FACTORIES",
    "BestFitPolicy",
    "ClusterState",
    "DotProdPolicy",
    "FGDPolicy",
    "FragmentationModel",
    "NodeSpec",
    "PackingPolicy",
    "Placement",
    "PlacementInputError",
    "PlacementPolicy",
    "PodShape",
    "RandomPolicy",
    "TesseraPolicy",
    "TypicalPod",
    "WorkloadProfile",
    "make_policy",
    "place_all",
    "placed_shape",
    "random_ranks",
    "typical_pods",
    "typical_workload",
]
