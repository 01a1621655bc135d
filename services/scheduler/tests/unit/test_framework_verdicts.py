"""Verdicts kept per pod shape and batched scoring decide exactly as filtering and scoring every node afresh.

A seeded workload (whole GPUs, shares, CPU-only and model-constrained pods, gangs with members on
racks) runs through two frameworks over one cache: the default one, which keeps node-local verdicts
and scores fragmentation in batches, and one that keeps none. Between decisions pods leave, GPUs
fail and recover, nodes are cordoned and the expected workload is learnt again. Every decision must
match: node, score, every feasible node's total, the filter diagnosis and the GPUs chosen.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from tessera.scheduler.domain.cache import SchedulerCache
from tessera.scheduler.domain.framework.builders import make_node, make_pod
from tessera.scheduler.domain.framework.cycle_state import CycleState
from tessera.scheduler.domain.framework.pod import PodSpec, Policy
from tessera.scheduler.domain.framework.runtime import Framework, ScheduleResult
from tessera.scheduler.domain.framework.verdicts import VerdictCache
from tessera.scheduler.domain.gang.registry import GangRegistry
from tessera.scheduler.domain.placement import ClusterState, FragmentationModel, NodeSpec, TypicalPod
from tessera.scheduler.domain.placement.observed_workload import OPENB_TYPICAL_WORKLOAD
from tessera.scheduler.domain.plugins.filters import GPU_CHOICE
from tessera.scheduler.domain.plugins.fragmentation import FragmentationScore
from tessera.scheduler.domain.plugins.profiles import build_profile
from tessera.scheduler.domain.plugins.reserve import RecordingBinder
from tessera.scheduler.domain.plugins.scores import GangLocalityScore
from tessera.scheduler.domain.snapshot import NodeInfo

MODELS = ("A100-80GB", "V100", "T4")
OTHER_WORKLOAD = (
    TypicalPod(2000, 1, 100, frozenset(), 0.5),
    TypicalPod(16000, 2, 1000, frozenset({"V100"}), 0.3),
    TypicalPod(64000, 8, 1000, frozenset(), 0.2),
)


def cluster(rng: random.Random, size: int) -> list[NodeInfo]:
    nodes = []
    for i in range(size):
        builder = make_node(f"n{i:03d}").gpus(rng.choice((0, 1, 2, 4, 8)), rng.choice(MODELS))
        builder = builder.cpu(rng.choice((32_000, 64_000, 96_000)), rng.choice((262_144, 524_288)))
        nodes.append(builder.rack(f"r{i % 5}").build())
    return nodes


SHAPES = (
    {"gpus": 1, "milli": 250, "cpu_milli": 4000},
    {"gpus": 1, "milli": 500, "cpu_milli": 4000, "models": ("T4",)},
    {"gpus": 1, "cpu_milli": 8000},
    {"gpus": 2, "cpu_milli": 16000, "gpu_policy": Policy.SPREAD},
    {"gpus": 4, "cpu_milli": 32000, "models": ("A100-80GB", "V100")},
    {"gpus": 0, "cpu_milli": 6000},
    {"gpus": 1, "milli": 300, "cpu_milli": 2000, "node_policy": Policy.SPREAD},
)


def expected_score(
    model: FragmentationModel,
    index: dict[str, int],
    pod: PodSpec,
    node: NodeInfo,
    choice: tuple[tuple[int, int], ...],
) -> int:
    """The fragmentation score as first written: one numpy evaluation of two rows per node."""
    if not choice or not node.gpus or node.gpus[0].model not in index:
        return 50
    before = [gpu.idle_milli if gpu.healthy else 0 for gpu in node.gpus]
    after = list(before)
    for gpu, milli in choice:
        after[gpu] -= milli
    cpu_left = node.cpu_milli - node.cpu_used
    model_index = index[node.gpus[0].model]
    fragmentation = model.evaluate(
        np.array([cpu_left, cpu_left - pod.cpu_milli], dtype=np.int64),
        np.array([before, after], dtype=np.int64),
        np.array([model_index, model_index], dtype=np.int64),
    )
    change = float(fragmentation[0] - fragmentation[1])
    return min(100, math.floor(100 / (1.0 + math.exp(-change / 1000.0))))


def same(a: ScheduleResult, b: ScheduleResult) -> None:
    assert (a.node, a.score, a.feasible_nodes, a.scores) == (b.node, b.score, b.feasible_nodes, b.scores)
    assert a.filtered == b.filtered and a.diagnosis == b.diagnosis


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kept_verdicts_decide_as_every_node_afresh(seed: int) -> None:
    rng = random.Random(seed)
    nodes = cluster(rng, 60)
    cache = SchedulerCache.rebuild(nodes)
    registry = GangRegistry()
    fragmentation = FragmentationScore(OPENB_TYPICAL_WORKLOAD, MODELS)
    profile = build_profile(cache, registry, RecordingBinder(), gangs=False, fragmentation=fragmentation)
    kept, afresh = Framework(profile), Framework(profile, max_verdicts=0)
    placed: list[str] = []
    decisions = 0
    for i in range(400):
        gang = f"gang-{i // 3}"  # three members a gang: GangLocality scores their nodes and racks
        pod = make_pod(f"p{i}", gang, **SHAPES[rng.randrange(len(SHAPES))])  # type: ignore[arg-type]
        snapshot = cache.snapshot()
        fast, slow = CycleState(), CycleState()
        result = kept.schedule_pod(fast, pod, snapshot)
        same(result, afresh.schedule_pod(slow, pod, snapshot))
        if result.node is not None:
            decisions += 1
            choice = fast.read(GPU_CHOICE).get(result.node, ()) if pod.gpu_count else ()
            assert choice == (slow.read(GPU_CHOICE).get(result.node, ()) if pod.gpu_count else ())
            assert kept.run_reserve(fast, pod, result.node).ok
            placed.append(pod.name)
        event = rng.random()
        if event < 0.3 and placed:
            cache.remove_pod(placed.pop(rng.randrange(len(placed))))
        elif event < 0.35:
            node = rng.choice([n for n in nodes if n.gpus])
            cache.set_gpu_health(node.name, rng.randrange(node.gpu_count), rng.random() < 0.5)
        elif event < 0.38:
            cache.set_schedulable(rng.choice(nodes).name, rng.random() < 0.6)
        elif event < 0.39:
            fragmentation.expect(
                OTHER_WORKLOAD if fragmentation.revision % 2 == 0 else OPENB_TYPICAL_WORKLOAD
            )
    assert decisions > 200, "the workload should place most pods"


def test_batched_fragmentation_scores_equal_the_per_node_formula() -> None:
    rng = random.Random(7)
    nodes = cluster(rng, 80)
    cache = SchedulerCache.rebuild(nodes)
    score = FragmentationScore(OPENB_TYPICAL_WORKLOAD, MODELS)
    reference = FragmentationModel(
        list(OPENB_TYPICAL_WORKLOAD), ClusterState([NodeSpec(m, 0, 0, 0, m) for m in sorted(MODELS)])
    )
    index = {model: i for i, model in enumerate(sorted(MODELS))}
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    compared = 0
    for i in range(150):
        pod = make_pod(f"p{i}", f"p{i}", **SHAPES[rng.randrange(len(SHAPES))])  # type: ignore[arg-type]
        state = CycleState()
        snapshot = cache.snapshot()
        result = framework.schedule_pod(state, pod, snapshot)
        feasible = [snapshot.node(name) for name in result.scores]
        score.pre_score(state, pod, feasible)  # all at once, as the framework asks
        choices = state.read(GPU_CHOICE) if pod.gpu_count else {}
        for node in feasible:
            assert score.score(state, pod, node) == expected_score(
                reference, index, pod, node, choices.get(node.name, ())
            )
            compared += 1
        if result.node is not None:
            assert framework.run_reserve(state, pod, result.node).ok
    assert compared > 1000


def test_gang_locality_names_every_node_it_scores_above_zero() -> None:
    nodes = [make_node(f"n{i}").gpus(2).rack(f"r{i % 3}").build() for i in range(9)]
    cache = SchedulerCache.rebuild(nodes)
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    first = make_pod("a-0", "a")
    state = CycleState()
    result = framework.schedule_pod(state, first, cache.snapshot())
    assert result.node is not None and framework.run_reserve(state, first, result.node).ok
    locality = GangLocalityScore()
    for pod in (make_pod("a-1", "a"), make_pod("a-2", "a", node_policy=Policy.SPREAD), make_pod("b-0", "b")):
        state = CycleState()
        snapshot = cache.snapshot()
        locality.pre_filter(state, pod, snapshot)
        each = {node.name: locality.score(state, pod, node) for node in snapshot.nodes.values()}
        assert locality.sparse_score(state, pod, snapshot.nodes) == {n: s for n, s in each.items() if s}
    assert any(each.values()) is False  # gang b has no member yet: no node scores above zero


def test_the_verdict_cache_keeps_shapes_within_its_bound() -> None:
    verdicts = VerdictCache(max_verdicts=100)
    for shape in range(5):
        verdicts.for_shape(shape, nodes=40)  # 100 // 40: two shapes fit
    assert len(verdicts) == 2
    with pytest.raises(ValueError, match="max_verdicts"):
        VerdictCache(max_verdicts=0)
