"""The typical workload learnt from recent placements: the openb shape until there are enough GPU
pods, then the observed shapes; and the fragmentation score following what it learnt."""

from __future__ import annotations

import pytest

from tessera.scheduler.domain.cache import SchedulerCache
from tessera.scheduler.domain.framework.builders import make_node, make_pod
from tessera.scheduler.domain.framework.cycle_state import CycleState
from tessera.scheduler.domain.framework.runtime import Framework
from tessera.scheduler.domain.gang.registry import GangRegistry
from tessera.scheduler.domain.placement import (
    MILLI_PER_GPU,
    OPENB_TYPICAL_WORKLOAD,
    PodShape,
    TypicalPod,
    placed_shape,
    typical_workload,
)
from tessera.scheduler.domain.plugins.fragmentation import FragmentationScore
from tessera.scheduler.domain.plugins.profiles import build_profile
from tessera.scheduler.domain.plugins.reserve import RecordingBinder

EIGHT = PodShape(cpu_milli=32_000, memory_mib=256_000, num_gpu=8, gpu_milli=MILLI_PER_GPU)
QUARTER = PodShape(cpu_milli=2_000, memory_mib=8_000, num_gpu=1, gpu_milli=250)
CPU_ONLY = PodShape(cpu_milli=1_000, memory_mib=1_000)


def test_too_few_placements_keep_the_openb_workload() -> None:
    assert typical_workload([], min_pods=50) == OPENB_TYPICAL_WORKLOAD
    assert typical_workload([EIGHT] * 49, min_pods=50) == OPENB_TYPICAL_WORKLOAD


def test_pods_without_gpus_do_not_count_towards_enough() -> None:
    assert typical_workload([EIGHT] * 49 + [CPU_ONLY] * 100, min_pods=50) == OPENB_TYPICAL_WORKLOAD


def test_enough_placements_replace_openb_with_the_observed_shapes() -> None:
    learnt = typical_workload([EIGHT] * 60 + [QUARTER] * 40 + [CPU_ONLY] * 500, min_pods=50)

    assert learnt == (
        TypicalPod(32_000, 8, MILLI_PER_GPU, frozenset(), 0.6),
        TypicalPod(2_000, 1, 250, frozenset(), 0.4),
    )


def test_the_profile_shifts_towards_what_is_placed() -> None:
    openb_eight = sum(t.weight for t in OPENB_TYPICAL_WORKLOAD if t.num_gpu == 8)
    learnt = typical_workload([EIGHT] * 30 + [QUARTER] * 30, min_pods=50)

    learnt_eight = sum(t.weight for t in learnt if t.num_gpu == 8)
    assert learnt_eight == pytest.approx(0.5) and learnt_eight > openb_eight


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        (((0, 1000), (1, 1000)), PodShape(4_000, 16_000, 2, 1000)),
        (((3, 250),), PodShape(4_000, 16_000, 1, 250)),
        ((), None),  # CPU only, or MIG slices
        (((0, 500), (1, 1000)), None),  # uneven: not a shape the fragmentation measure knows
        (((0, 500), (1, 500)), None),  # shares of several GPUs
    ],
)
def test_the_shape_of_a_placement(gpus: tuple[tuple[int, int], ...], expected: PodShape | None) -> None:
    assert placed_shape(gpus, 4_000, 16_000) == expected


def test_the_fragmentation_score_follows_the_learnt_workload() -> None:
    # A single-GPU pod can go to a node with a free pair of GPUs or to one with a lone GPU.
    cache = SchedulerCache.rebuild([make_node("pair").gpus(2).build(), make_node("lone").gpus(1).build()])
    pod = make_pod("p", gpus=1)
    state = CycleState()
    Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False)).schedule_pod(
        state, pod, cache.snapshot()
    )
    snapshot = cache.snapshot()
    score = FragmentationScore(typical_workload([], min_pods=50), ["A100-80GB"])

    def gap() -> int:
        return score.score(state, pod, snapshot.node("lone")) - score.score(state, pod, snapshot.node("pair"))

    cold = gap()
    score.expect(typical_workload([PodShape(0, 0, 2, MILLI_PER_GPU)] * 60, min_pods=50))

    assert score.typical == (TypicalPod(0, 2, MILLI_PER_GPU, frozenset(), 1.0),)
    assert gap() > cold, "a workload of GPU pairs makes breaking a free pair costlier"
    assert (
        score.score(state, pod, snapshot.node("pair")) < 50 < score.score(state, pod, snapshot.node("lone"))
    )
