"""Feasibility and bookkeeping of the array-backed cluster state."""

from __future__ import annotations

import pytest

from tessera.scheduler.domain.placement import (
    ClusterState,
    NodeSpec,
    Placement,
    PlacementInputError,
    PodShape,
)


def node(
    name: str = "n0", cpu: int = 32_000, mem: int = 65_536, gpus: int = 2, model: str = "V100"
) -> NodeSpec:
    return NodeSpec(name, cpu, mem, gpus, model)


def pod(cpu: int = 1_000, mem: int = 1_024, k: int = 0, g: int = 0, models: tuple[str, ...] = ()) -> PodShape:
    return PodShape(cpu, mem, k, g, frozenset(models))


def cluster_with(
    gpu_left: list[int], cpu_left: int = 32_000, mem_left: int = 65_536, model: str = "V100"
) -> ClusterState:
    """One node whose GPUs have `gpu_left` milli idle and the given CPU and memory left."""
    state = ClusterState([node(gpus=len(gpu_left), model=model)])
    state.apply(pod(cpu=32_000 - cpu_left, mem=65_536 - mem_left), Placement(0))
    for slot, left in enumerate(gpu_left):
        if left < 1000:
            state.apply(pod(cpu=0, mem=0, k=1, g=1000 - left), Placement(0, (slot,)))
    return state


@pytest.mark.parametrize(
    ("case", "gpu_left", "cpu_left", "mem_left", "asked", "fits"),
    [
        ("cpu-only fits", [1000, 1000], 32_000, 65_536, pod(cpu=8_000), True),
        ("cpu too small", [1000, 1000], 4_000, 65_536, pod(cpu=8_000), False),
        ("memory too small", [1000, 1000], 32_000, 1_000, pod(mem=2_000), False),
        ("sharing fits one gpu", [300, 600], 32_000, 65_536, pod(k=1, g=500), True),
        ("sharing needs one gpu, not the sum", [300, 300], 32_000, 65_536, pod(k=1, g=500), False),
        ("whole gpu needs an idle one", [999, 999], 32_000, 65_536, pod(k=1, g=1000), False),
        ("two gpus, both idle", [1000, 1000], 32_000, 65_536, pod(k=2, g=1000), True),
        ("two gpus, one partly used", [1000, 900], 32_000, 65_536, pod(k=2, g=1000), False),
        ("model allowed", [1000, 1000], 32_000, 65_536, pod(k=1, g=500, models=("V100", "T4")), True),
        ("model not allowed", [1000, 1000], 32_000, 65_536, pod(k=1, g=500, models=("T4",)), False),
        ("cpu-only pod ignores the model list", [0, 0], 32_000, 65_536, pod(cpu=1, models=("T4",)), True),
    ],
)
def test_feasibility_rules(
    case: str, gpu_left: list[int], cpu_left: int, mem_left: int, asked: PodShape, fits: bool
) -> None:
    state = cluster_with(gpu_left, cpu_left, mem_left)
    assert bool(state.feasible(asked)[0]) is fits, case


def test_apply_updates_free_resources_and_version() -> None:
    state = ClusterState([node(gpus=4)])
    state.apply(pod(cpu=2_000, mem=512, k=1, g=300), Placement(0, (2,)))
    state.apply(pod(cpu=1_000, mem=512, k=2, g=1000), Placement(0, (0, 1)))
    assert state.cpu_left[0] == 29_000
    assert state.memory_left[0] == 65_536 - 1_024
    assert state.gpu_left[0].tolist() == [0, 0, 700, 1000]
    assert state.gpu_free[0] == 1_700
    assert state.idle_gpus[0] == 1
    assert state.max_gpu_left[0] == 1000
    assert state.version[0] == 2
    assert state.gpu_used_milli == 2_300


def test_release_gives_back_what_apply_took() -> None:
    state = ClusterState([node(gpus=2)])
    asked, where = pod(cpu=2_000, mem=512, k=1, g=400), Placement(0, (1,))
    state.apply(asked, where)
    state.release(asked, where)
    assert state.gpu_left[0].tolist() == [1000, 1000]
    assert state.cpu_left[0] == 32_000
    with pytest.raises(PlacementInputError):
        state.release(asked, where)


@pytest.mark.parametrize(
    ("case", "asked", "where"),
    [
        ("gpu slot does not exist", pod(k=1, g=500), Placement(0, (5,))),
        ("wrong number of gpus", pod(k=2, g=1000), Placement(0, (0,))),
        ("same gpu twice", pod(k=2, g=1000), Placement(0, (0, 0))),
        ("node does not exist", pod(), Placement(3)),
        ("too much cpu", pod(cpu=64_000), Placement(0)),
    ],
)
def test_apply_rejects_a_placement_that_does_not_fit(case: str, asked: PodShape, where: Placement) -> None:
    state = ClusterState([node(gpus=2)])
    with pytest.raises(PlacementInputError, match="does not fit"):
        state.apply(asked, where)


def test_missing_gpu_slots_of_smaller_nodes_never_fit() -> None:
    state = ClusterState([node("big", gpus=4), node("small", gpus=1)])
    assert state.gpu_left.shape == (2, 4)
    assert state.feasible(pod(k=2, g=1000)).tolist() == [True, False]
    assert state.gpu_capacity_milli == 5_000


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cpu_milli": -1, "memory_mib": 0}, "cpu_milli"),
        ({"cpu_milli": 0, "memory_mib": -5}, "memory_mib"),
        ({"cpu_milli": 0, "memory_mib": 0, "num_gpu": 1, "gpu_milli": 0}, "gpu_milli"),
        ({"cpu_milli": 0, "memory_mib": 0, "num_gpu": 1, "gpu_milli": 1001}, "gpu_milli"),
        ({"cpu_milli": 0, "memory_mib": 0, "num_gpu": 2, "gpu_milli": 500}, "gpu_milli"),
        ({"cpu_milli": 0, "memory_mib": 0, "num_gpu": 0, "gpu_milli": 300}, "gpu_milli"),
    ],
)
def test_bad_pod_names_the_field(kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(PlacementInputError, match=field):
        PodShape(**kwargs)  # type: ignore[arg-type]


def test_bad_node_names_the_field() -> None:
    with pytest.raises(PlacementInputError, match="gpu_count"):
        NodeSpec("n", 1_000, 1_000, -1, "T4")
    with pytest.raises(PlacementInputError, match="nodes"):
        ClusterState([])
