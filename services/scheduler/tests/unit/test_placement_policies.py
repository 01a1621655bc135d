"""Each policy's choice on small hand-built clusters."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.scheduler.domain.placement import (
    BestFitPolicy,
    ClusterState,
    DotProdPolicy,
    FGDPolicy,
    FragmentationModel,
    NodeSpec,
    PackingPolicy,
    Placement,
    PlacementPolicy,
    PodShape,
    RandomPolicy,
    TesseraPolicy,
    TypicalPod,
    WorkloadProfile,
)
from tessera.scheduler.domain.placement.fgd import fgd_score
from tessera.scheduler.domain.placement.tessera_policy import stranded_gpu_milli

HALF = TypicalPod(cpu_milli=0, num_gpu=1, gpu_milli=500, gpu_models=frozenset(), weight=1.0)


def cluster(*nodes: tuple[int, list[int]], model: str = "V100") -> ClusterState:
    """Nodes given as (cpu milli left, [GPU milli left per slot]); each node has 64 cores and 64 GiB."""
    specs = [NodeSpec(f"n{i}", 64_000, 65_536, len(gpus), model) for i, (_, gpus) in enumerate(nodes)]
    state = ClusterState(specs)
    for i, (cpu_left, gpus) in enumerate(nodes):
        state.apply(PodShape(64_000 - cpu_left, 0), Placement(i))
        for slot, left in enumerate(gpus):
            if left < 1000:
                state.apply(PodShape(0, 0, 1, 1000 - left), Placement(i, (slot,)))
    return state


def ranks(*order: int) -> np.ndarray:
    return np.array(order, dtype=np.int64)


def share(g: int, cpu: int = 0) -> PodShape:
    return PodShape(cpu, 0, 1, g)


def fgd(state: ClusterState, rank: np.ndarray, *typical: TypicalPod) -> FGDPolicy:
    return FGDPolicy(FragmentationModel(list(typical or [HALF]), state), rank)


def tessera(
    state: ClusterState, rank: np.ndarray, cpu_per_gpu_milli: float, *typical: TypicalPod
) -> TesseraPolicy:
    kinds = list(typical or [HALF])
    profile = WorkloadProfile(kinds, cpu_per_gpu_milli=cpu_per_gpu_milli, memory_per_gpu_milli=0.0)
    return TesseraPolicy(FragmentationModel(kinds, state), profile, rank)


def test_bestfit_picks_least_leftover_and_smallest_gpu() -> None:
    state = cluster((64_000, [1000, 1000]), (64_000, [1000, 600]))
    choice = BestFitPolicy(ranks(0, 1)).choose(state, share(500))
    assert choice == Placement(1, (1,))


def test_fgd_picks_the_smallest_fragmentation_increase_where_bestfit_does_not() -> None:
    # n0 keeps a 500 slot whole after taking 500; on n1 the 600 GPU would be left with a useless 100.
    state = cluster((64_000, [1000, 1000]), (64_000, [600, 0]))
    assert BestFitPolicy(ranks(1, 0)).choose(state, share(500)) == Placement(1, (0,))
    assert fgd(state, ranks(1, 0)).choose(state, share(500)) == Placement(0, (0,))


def test_fgd_tries_every_gpu_for_a_sharing_pod() -> None:
    # slot 1 (600) would keep a 100 fragment; slot 0 leaves 500, still useful to the typical pod.
    state = cluster((64_000, [1000, 600]))
    assert fgd(state, ranks(0)).choose(state, share(500)) == Placement(0, (0,))


def test_fgd_score_is_an_integer_sigmoid_of_the_fragmentation_decrease() -> None:
    scores = fgd_score(np.array([[0.0, 1000.0, -1000.0, np.inf]]))
    assert scores.tolist() == [[50.0, 26.0, 73.0, -np.inf]]


@pytest.mark.parametrize("make", [BestFitPolicy, DotProdPolicy])
def test_ties_go_to_the_lowest_rank(make: type[BestFitPolicy] | type[DotProdPolicy]) -> None:
    state = cluster((64_000, [1000]), (64_000, [1000]), (64_000, [1000]))
    assert make(ranks(2, 0, 1)).choose(state, share(1000)) == Placement(1, (0,))
    assert make(ranks(1, 2, 0)).choose(state, share(1000)) == Placement(2, (0,))


def test_dotprod_prefers_the_least_aligned_node() -> None:
    # The request is GPU-heavy: the node with less free GPU (more free CPU) aligns less.
    state = cluster((64_000, [1000, 1000, 1000, 1000]), (64_000, [1000, 0, 0, 0]))
    assert DotProdPolicy(ranks(0, 1)).choose(state, PodShape(1_000, 0, 1, 1000)) == Placement(1, (0,))


@pytest.mark.parametrize(
    ("node_mode", "gpu_mode", "expected"),
    [
        ("binpack", "binpack", Placement(0, (0,))),
        ("binpack", "spread", Placement(0, (1,))),
        ("spread", "binpack", Placement(1, (0,))),
        ("spread", "spread", Placement(1, (0,))),
    ],
)
def test_binpack_and_spread(node_mode: str, gpu_mode: str, expected: Placement) -> None:
    # n0 is partly used (a GPU with 300 left and an idle one); n1 is empty.
    state = cluster((32_000, [300, 1000]), (64_000, [1000, 1000]))
    policy = PackingPolicy(ranks(0, 1), node_mode, gpu_mode)  # type: ignore[arg-type]
    assert policy.choose(state, share(200)) == expected


def test_tessera_keeps_cpu_for_idle_gpus_where_fgd_sees_no_difference() -> None:
    # A CPU-only pod: both nodes still run the typical pod afterwards, so FGD ties (rank says n0).
    # n0 has 8 idle GPUs and 40 cores, already short of the 10 cores per GPU the workload needs;
    # n1 has 2 idle GPUs and 100 cores. Tessera sends the pod to n1.
    whole = TypicalPod(cpu_milli=10_000, num_gpu=1, gpu_milli=1000, gpu_models=frozenset(), weight=1.0)
    state = cluster((40_000, [1000] * 8), (64_000, [1000, 1000]))
    cpu_pod = PodShape(20_000, 0)
    assert fgd(state, ranks(0, 1), whole).choose(state, cpu_pod) == Placement(0)
    assert tessera(state, ranks(0, 1), 10.0, whole).choose(state, cpu_pod) == Placement(1)


def test_tessera_without_balance_follows_the_fragmentation_gradient() -> None:
    state = cluster((64_000, [1000, 1000]), (64_000, [600, 0]))
    policy = tessera(state, ranks(1, 0), 10.0)
    assert policy.choose(state, share(500)) == Placement(0, (0,))


def test_tessera_takes_the_best_fitting_gpu_among_equal_scores() -> None:
    # Both 700 and 900 slots keep the node useful for the typical 100-milli pod: equal gradient,
    # so Tessera takes the tighter GPU (700 -> 100 left), where FGD takes the first slot.
    small = TypicalPod(cpu_milli=0, num_gpu=1, gpu_milli=100, gpu_models=frozenset(), weight=1.0)
    state = cluster((64_000, [900, 700]))
    assert fgd(state, ranks(0), small).choose(state, share(600)) == Placement(0, (0,))
    assert tessera(state, ranks(0), 0.0, small).choose(state, share(600)) == Placement(0, (1,))


@pytest.mark.parametrize(
    ("idle", "cpu", "mem", "cpu_ratio", "mem_ratio", "expected"),
    [
        (8_000, 40_000, 0, 10.0, 0.0, 4_000.0),  # 40 cores feed 4 GPUs of 8
        (2_000, 100_000, 0, 10.0, 0.0, 0.0),  # plenty of CPU
        (4_000, 100_000, 10_000, 10.0, 5.0, 2_000.0),  # memory is the tighter limit
        (4_000, 0, 0, 0.0, 0.0, 0.0),  # a workload that asks nothing but GPUs
    ],
)
def test_stranded_gpu_milli(
    idle: int, cpu: int, mem: int, cpu_ratio: float, mem_ratio: float, expected: float
) -> None:
    profile = WorkloadProfile([HALF], cpu_per_gpu_milli=cpu_ratio, memory_per_gpu_milli=mem_ratio)
    got = stranded_gpu_milli(np.array([idle]), np.array([cpu]), np.array([mem]), profile)
    assert got.tolist() == [expected]


def test_workload_profile_from_pods() -> None:
    pods = [PodShape(8_000, 4_000, 1, 1000), PodShape(2_000, 1_000, 1, 500), PodShape(30_000, 100)]
    profile = WorkloadProfile.from_pods(pods)
    assert profile.cpu_per_gpu_milli == pytest.approx(10_000 / 1_500)
    assert profile.memory_per_gpu_milli == pytest.approx(5_000 / 1_500)
    assert len(profile.typical) == 3


def test_random_picks_only_feasible_nodes() -> None:
    state = cluster((64_000, [0, 0]), (64_000, [1000, 0]), (64_000, [0, 0]))
    policy = RandomPolicy(seed=7)
    assert {policy.choose(state, share(1000)) for _ in range(20)} == {Placement(1, (0,))}


@pytest.mark.parametrize("kind", ["Random", "BestFit", "DotProd", "Binpack", "FGD", "Tessera"])
def test_every_policy_returns_none_when_nothing_fits_and_never_mutates(kind: str) -> None:
    state = cluster((64_000, [400, 400]), (2_000, [1000, 1000]))
    rank = ranks(0, 1)
    policies: dict[str, PlacementPolicy] = {
        "Random": RandomPolicy(1),
        "BestFit": BestFitPolicy(rank),
        "DotProd": DotProdPolicy(rank),
        "Binpack": PackingPolicy(rank),
        "FGD": fgd(state, rank),
        "Tessera": tessera(state, rank, 10.0),
    }
    before = state.gpu_left.copy(), state.version.copy()
    assert policies[kind].choose(state, share(500, cpu=4_000)) is None
    whole = policies[kind].choose(state, PodShape(1_000, 0, 2, 1000))
    assert whole == Placement(1, (0, 1))
    assert (state.gpu_left == before[0]).all() and (state.version == before[1]).all()


def test_fgd_with_only_cpu_typical_pods_still_places_sharing_pods() -> None:
    cpu_only = TypicalPod(cpu_milli=1_000, num_gpu=0, gpu_milli=0, gpu_models=frozenset(), weight=1.0)
    state = cluster((64_000, [1000, 400]))
    assert fgd(state, ranks(0), cpu_only).choose(state, share(300)) == Placement(0, (0,))


def test_random_shares_any_gpu_that_fits() -> None:
    state = cluster((64_000, [1000, 200, 600]))
    policy = RandomPolicy(seed=3)
    seen = {policy.choose(state, share(500)) for _ in range(40)}
    assert seen == {Placement(0, (0,)), Placement(0, (2,))}


def test_tessera_sends_cpu_pods_to_gpu_less_nodes_before_starving_gpus() -> None:
    whole = TypicalPod(cpu_milli=10_000, num_gpu=1, gpu_milli=1000, gpu_models=frozenset(), weight=1.0)
    state = ClusterState([NodeSpec("gpu", 40_000, 65_536, 4, "T4"), NodeSpec("cpu", 40_000, 65_536, 0, "")])
    cpu_pod = PodShape(20_000, 0)
    assert state.feasible(cpu_pod).tolist() == [True, True]
    assert state.feasible(PodShape(1_000, 0, 1, 500)).tolist() == [True, False]
    assert tessera(state, ranks(0, 1), 10.0, whole).choose(state, cpu_pod) == Placement(1)
