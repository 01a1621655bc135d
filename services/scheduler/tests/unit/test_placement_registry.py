"""Policies by name, and all-or-nothing placement of a group of pods."""

from __future__ import annotations

import pytest

from tessera.scheduler.domain.placement import (
    POLICY_FACTORIES,
    ClusterState,
    NodeSpec,
    Placement,
    PlacementInputError,
    PodShape,
    WorkloadProfile,
    make_policy,
    place_all,
)

WHOLE = PodShape(8_000, 1_024, 1, 1000)
HALF = PodShape(4_000, 1_024, 1, 500)
PROFILE = WorkloadProfile.from_pods([WHOLE, HALF, HALF])


def two_nodes() -> ClusterState:
    return ClusterState([NodeSpec("a", 32_000, 65_536, 2, "T4"), NodeSpec("b", 32_000, 65_536, 2, "T4")])


@pytest.mark.parametrize("name", sorted(POLICY_FACTORIES))
def test_every_named_policy_places_a_group_and_reports_its_name(name: str) -> None:
    state = two_nodes()
    policy = make_policy(name, state, PROFILE, seed=42)
    placements = place_all(state, policy, [WHOLE, HALF, HALF])
    assert placements is not None and len(placements) == 3
    assert state.gpu_used_milli == 2_000
    expected = {"Binpack": "NodeBinpack-GpuBinpack", "Spread": "NodeSpread-GpuSpread"}.get(name, name)
    assert policy.name == expected


def test_unknown_policy_is_refused_by_name() -> None:
    with pytest.raises(PlacementInputError, match="policy must be one of"):
        make_policy("Worst", two_nodes(), PROFILE, seed=1)


def test_place_all_is_all_or_nothing() -> None:
    state = two_nodes()
    policy = make_policy("Tessera", state, PROFILE, seed=1)
    before = state.gpu_left.copy(), state.cpu_left.copy()
    # four whole GPUs fit, the fifth does not: nothing may stay placed
    assert place_all(state, policy, [WHOLE] * 5) is None
    assert (state.gpu_left == before[0]).all() and (state.cpu_left == before[1]).all()
    # the policy still decides correctly after the rollback (its caches follow node versions)
    assert place_all(state, policy, [WHOLE] * 4) is not None
    assert state.gpu_used_milli == 4_000


def test_place_all_members_see_each_other() -> None:
    state = ClusterState([NodeSpec("a", 32_000, 65_536, 1, "T4")])
    placements = place_all(state, make_policy("FGD", state, PROFILE, seed=1), [HALF, HALF])
    assert placements == [Placement(0, (0,)), Placement(0, (0,))]
    assert state.gpu_left[0, 0] == 0
