"""Policies by name, and all-or-nothing placement of a group of pods.

The scheduler and the benchmark build policies here, so both run the same configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tessera.scheduler.domain.placement.choice import random_ranks
from tessera.scheduler.domain.placement.fgd import FGDPolicy
from tessera.scheduler.domain.placement.fragmentation import FragmentationModel
from tessera.scheduler.domain.placement.model import Placement, PlacementInputError, PodShape
from tessera.scheduler.domain.placement.policies import (
    BestFitPolicy,
    DotProdPolicy,
    PackingPolicy,
    PlacementPolicy,
    RandomPolicy,
)
from tessera.scheduler.domain.placement.state import ClusterState
from tessera.scheduler.domain.placement.tessera_policy import TesseraPolicy, WorkloadProfile

_Factory = Callable[[ClusterState, WorkloadProfile, int], PlacementPolicy]


def _fgd(state: ClusterState, profile: WorkloadProfile, seed: int) -> PlacementPolicy:
    return FGDPolicy(FragmentationModel(profile.typical, state), random_ranks(state.num_nodes, seed))


def _tessera(state: ClusterState, profile: WorkloadProfile, seed: int) -> PlacementPolicy:
    model = FragmentationModel(profile.typical, state)
    return TesseraPolicy(model, profile, random_ranks(state.num_nodes, seed))


POLICY_FACTORIES: dict[str, _Factory] = {
    "Random": lambda state, profile, seed: RandomPolicy(seed),
    "BestFit": lambda state, profile, seed: BestFitPolicy(random_ranks(state.num_nodes, seed)),
    "DotProd": lambda state, profile, seed: DotProdPolicy(random_ranks(state.num_nodes, seed)),
    "FGD": _fgd,
    "Tessera": _tessera,
    "Binpack": lambda state, profile, seed: PackingPolicy(
        random_ranks(state.num_nodes, seed), "binpack", "binpack"
    ),
    "Spread": lambda state, profile, seed: PackingPolicy(
        random_ranks(state.num_nodes, seed), "spread", "spread"
    ),
}


def make_policy(name: str, state: ClusterState, profile: WorkloadProfile, seed: int) -> PlacementPolicy:
    """The policy called `name` for `state`, with ties (and Random's draws) fixed by `seed`."""
    factory = POLICY_FACTORIES.get(name)
    if factory is None:
        raise PlacementInputError(f"policy must be one of {', '.join(POLICY_FACTORIES)}, got {name!r}")
    return factory(state, profile, seed)


def place_all(
    state: ClusterState, policy: PlacementPolicy, pods: Sequence[PodShape]
) -> list[Placement] | None:
    """Place every pod of a group, each seeing the ones before it, or none of them.

    On success the placements are applied to `state`; when a member fits nowhere, the members
    already applied are released again and `state` is as it was.
    """
    done: list[tuple[PodShape, Placement]] = []
    for pod in pods:
        placement = policy.choose(state, pod)
        if placement is None:
            for placed_pod, placed in reversed(done):
                state.release(placed_pod, placed)
            return None
        state.apply(pod, placement)
        done.append((pod, placement))
    return [placement for _, placement in done]
