"""The FGD arrival sequence, the replay loop and the allocation curve."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.scheduler.domain.placement import (
    BestFitPolicy,
    ClusterState,
    FragmentationModel,
    NodeSpec,
    PlacementInputError,
    PodShape,
    typical_pods,
)
from tessera.scheduler.domain.placement.replay import arrival_sequence, ratio_curve, replay

GPU = PodShape(1_000, 0, 1, 1000)
HALF = PodShape(1_000, 0, 1, 500)
SMALL = PodShape(1_000, 0, 1, 100)
CPU = PodShape(1_000, 0)


def requested(pods: list[PodShape], seq: list[int]) -> int:
    return sum(pods[i].gpu_request_milli for i in seq)


@pytest.mark.parametrize("seed", [42, 43, 51])
def test_arrival_sequence_stops_at_130_percent(seed: int) -> None:
    pods = [GPU, HALF, SMALL, CPU, HALF]
    capacity = 20_000
    seq = arrival_sequence(pods, capacity, seed)
    total = requested(pods, seq)
    assert total <= 1.3 * capacity
    # it stopped at a pod that would pass 130%, so less than the largest request was missing
    assert total > 1.3 * capacity - max(p.gpu_request_milli for p in pods)


def test_arrival_sequence_with_equal_pods_fills_exactly_to_the_limit() -> None:
    pods = [GPU] * 4
    seq = arrival_sequence(pods, capacity_milli=10_000, seed=1)
    assert len(seq) == 13  # 13 x 1000 = 130% of 10,000


def test_arrival_sequence_starts_with_a_shuffle_of_every_pod() -> None:
    pods = [GPU, HALF, SMALL, CPU]
    seq = arrival_sequence(pods, capacity_milli=50_000, seed=5)
    assert sorted(seq[:4]) == [0, 1, 2, 3]
    assert len(seq) > 4


def test_arrival_sequence_is_fixed_by_the_seed() -> None:
    pods = [GPU, HALF, SMALL, CPU]
    assert arrival_sequence(pods, 50_000, 42) == arrival_sequence(pods, 50_000, 42)
    assert arrival_sequence(pods, 50_000, 42) != arrival_sequence(pods, 50_000, 43)


def test_arrival_sequence_cuts_a_pod_list_already_above_the_target() -> None:
    pods = [GPU] * 10
    seq = arrival_sequence(pods, capacity_milli=5_000, seed=0)
    assert requested(pods, seq) == 6_000


@pytest.mark.parametrize(
    ("pods", "capacity", "field"),
    [([], 1_000, "pods"), ([CPU, CPU], 1_000, "no pod requests a GPU"), ([GPU], 0, "capacity_milli")],
)
def test_arrival_sequence_rejects_bad_input(pods: list[PodShape], capacity: int, field: str) -> None:
    with pytest.raises(PlacementInputError, match=field):
        arrival_sequence(pods, capacity, seed=0)


def test_ratio_curve_averages_events_in_each_bucket_and_falls_back_to_neighbours() -> None:
    arrived = np.array([100, 1_000, 1_040, 3_000])  # 1%, 10%, 10.4% (rounds to 10), 30%
    used = np.array([100.0, 900.0, 1_000.0, 2_000.0])
    curve = ratio_curve(arrived, used, capacity_milli=10_000, xs=[1, 10, 11, 20, 30])
    assert curve[0] == pytest.approx(1.0)
    assert curve[1] == pytest.approx(9.5)  # mean of 9% and 10%
    assert curve[2] == pytest.approx(9.5)  # no event at 11: uses 10 (and 12)
    assert np.isnan(curve[3])
    assert curve[4] == pytest.approx(20.0)


def test_replay_counts_arrivals_allocation_failures_and_fragmentation() -> None:
    nodes = [NodeSpec("a", 8_000, 1_024, 1, "T4"), NodeSpec("b", 8_000, 1_024, 1, "T4")]
    arrivals = [HALF, GPU, HALF, GPU, SMALL]
    state = ClusterState(nodes)
    model = FragmentationModel(typical_pods(arrivals, coverage=1.0), state)
    result = replay(
        state, BestFitPolicy(np.array([0, 1])), arrivals, fragmentation=model, clock=iter(range(100)).__next__
    )
    assert result.arrived_milli.tolist() == [500, 1_500, 2_000, 3_000, 3_100]
    assert result.used_milli.tolist() == [500, 1_500, 2_000, 2_000, 2_000]
    assert result.failed == 2
    assert result.decision_seconds.tolist() == [1.0] * 5
    assert result.fragmentation_milli[-1] == pytest.approx(0.0)  # nothing idle is left
    assert state.gpu_used_milli == 2_000
