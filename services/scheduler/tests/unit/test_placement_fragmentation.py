"""FGD fragmentation: typical pods and per-node fragmentation, against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.scheduler.domain.placement import (
    ClusterState,
    FragmentationModel,
    NodeSpec,
    Placement,
    PlacementInputError,
    PodShape,
    TypicalPod,
    typical_pods,
)

# Typical pods of the hand-computed cases: A shares half a GPU (only on V100), B takes a whole GPU
# and 8 cores, C is CPU-only.
A = TypicalPod(cpu_milli=4_000, num_gpu=1, gpu_milli=500, gpu_models=frozenset({"V100"}), weight=0.5)
B = TypicalPod(cpu_milli=8_000, num_gpu=1, gpu_milli=1000, gpu_models=frozenset(), weight=0.3)
C = TypicalPod(cpu_milli=2_000, num_gpu=0, gpu_milli=0, gpu_models=frozenset(), weight=0.2)


def node_state(gpu_left: list[int], cpu_left: int, model: str = "V100") -> ClusterState:
    state = ClusterState([NodeSpec("n0", 32_000, 65_536, len(gpu_left), model)])
    state.apply(PodShape(32_000 - cpu_left, 0), Placement(0))
    for slot, left in enumerate(gpu_left):
        if left < 1000:
            state.apply(PodShape(0, 0, 1, 1000 - left), Placement(0, (slot,)))
    return state


@pytest.mark.parametrize(
    ("case", "gpu_left", "cpu_left", "model", "expected"),
    [
        # A runs: 300 too small -> 0.5*300; B runs: 300 too small -> 0.3*300; C: all 1300 -> 0.2*1300
        ("all typical gpu pods run", [1000, 300], 16_000, "V100", 150 + 90 + 260),
        # B lacks CPU -> all 1300 idle count for B
        ("B lacks cpu", [1000, 300], 6_000, "V100", 150 + 390 + 260),
        # A's model not allowed -> all 1300 idle count for A
        ("A not allowed on T4", [1000, 300], 16_000, "T4", 650 + 90 + 260),
        # no GPU idle for B (all below 1000): B counts all 1200; A runs, nothing below 500 -> 0
        ("B lacks a whole gpu", [600, 600], 16_000, "V100", 0 + 360 + 240),
        ("no idle gpu, no fragmentation", [0, 0], 16_000, "V100", 0),
        ("empty node with cpu", [1000, 1000], 32_000, "V100", 0 + 0 + 400),
    ],
)
def test_node_fragmentation_matches_hand_computation(
    case: str, gpu_left: list[int], cpu_left: int, model: str, expected: float
) -> None:
    state = node_state(gpu_left, cpu_left, model)
    frag = FragmentationModel([A, B, C], state).node_fragmentation(state)
    assert frag[0] == pytest.approx(expected), case


def test_multi_gpu_typical_pod_needs_enough_idle_gpus() -> None:
    eight = TypicalPod(cpu_milli=0, num_gpu=2, gpu_milli=1000, gpu_models=frozenset(), weight=1.0)
    two_idle = node_state([1000, 1000, 400], 16_000)
    one_idle = node_state([1000, 700, 400], 16_000)
    assert FragmentationModel([eight], two_idle).node_fragmentation(two_idle)[0] == pytest.approx(400)
    assert FragmentationModel([eight], one_idle).node_fragmentation(one_idle)[0] == pytest.approx(2_100)


def test_evaluate_many_states_at_once() -> None:
    state = node_state([1000, 1000], 32_000)
    model = FragmentationModel([A, B, C], state)
    frag = model.evaluate(
        cpu_left=np.array([16_000, 6_000]),
        gpu_left=np.array([[1000, 300], [1000, 300]]),
        model_idx=np.array([0, 0]),
    )
    assert frag.tolist() == pytest.approx([500, 800])


def shapes(*groups: tuple[int, PodShape]) -> list[PodShape]:
    return [p for count, p in groups for _ in range(count)]


def test_typical_pods_keep_the_most_frequent_groups_up_to_coverage() -> None:
    x, y, z = PodShape(1_000, 10, 1, 500), PodShape(2_000, 10, 1, 1000), PodShape(3_000, 10)
    pods = shapes((5, x), (3, y), (2, z))
    assert [(t.cpu_milli, t.weight) for t in typical_pods(pods, coverage=0.5)] == [(1_000, 1.0)]
    kept = typical_pods(pods, coverage=0.6)
    assert [(t.cpu_milli, t.gpu_milli, t.num_gpu) for t in kept] == [(1_000, 500, 1), (2_000, 1000, 1)]
    assert [t.weight for t in kept] == pytest.approx([5 / 8, 3 / 8])
    assert len(typical_pods(pods, coverage=1.0)) == 3


def test_typical_pods_group_by_cpu_gpu_and_models_not_memory() -> None:
    pods = [
        PodShape(1_000, 10, 1, 500),
        PodShape(1_000, 99, 1, 500),
        PodShape(1_000, 10, 1, 500, frozenset({"T4"})),
    ]
    kept = typical_pods(pods, coverage=1.0)
    assert [t.gpu_models for t in kept] == [frozenset(), frozenset({"T4"})]
    assert [t.weight for t in kept] == pytest.approx([2 / 3, 1 / 3])


def test_typical_pods_reject_bad_input() -> None:
    with pytest.raises(PlacementInputError, match="coverage"):
        typical_pods([PodShape(1, 1)], coverage=0)
    with pytest.raises(PlacementInputError, match="pods"):
        typical_pods([])
