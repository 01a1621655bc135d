"""MIG geometry enumeration against the catalogue's placement tables, and the exact single-GPU plan
against brute force."""

from __future__ import annotations

import functools
import itertools
import random
from collections import Counter

import pytest

from tessera.cluster.catalogue import GpuModel, model
from tessera.cluster.domain.gpu import MigInstance
from tessera.slicing.domain.geometry import enumerate_geometries, maximal_geometries, supporting_models
from tessera.slicing.domain.layout import GpuLayout, InvalidLayout, MigSlice
from tessera.slicing.domain.single_gpu import best_geometry, score_geometry

A100 = model("A100-80GB")
A30 = model("A30")


def _candidate_slices(gpu: GpuModel) -> list[MigSlice]:
    assert gpu.mig is not None
    return [MigSlice(start, p.name) for p in gpu.mig.profiles for start in p.placements]


@functools.cache
def _brute_force_geometries(gpu: GpuModel) -> frozenset[frozenset[MigSlice]]:
    """Every subset of (profile, start) pairs that the catalogue's validator accepts."""
    assert gpu.mig is not None
    candidates = _candidate_slices(gpu)
    valid = set()
    for size in range(len(candidates) + 1):
        for subset in itertools.combinations(candidates, size):
            if gpu.mig.is_valid(MigInstance(s.profile, s.start) for s in subset):
                valid.add(frozenset(subset))
    return frozenset(valid)


def test_a30_enumeration_equals_brute_force_over_every_subset() -> None:
    enumerated = [frozenset(g.slices) for g in enumerate_geometries(A30)]
    assert len(enumerated) == len(set(enumerated))
    assert set(enumerated) == _brute_force_geometries(A30)


@pytest.mark.parametrize("name", ["A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"])
def test_every_enumerated_geometry_is_valid_and_every_fitting_mix_is_found(name: str) -> None:
    gpu = model(name)
    assert gpu.mig is not None
    geometries = enumerate_geometries(gpu)
    assert len({g.slices for g in geometries}) == len(geometries)
    for geometry in geometries:
        gpu.mig.validate(MigInstance(s.profile, s.start) for s in geometry.slices)
    # Every mix of profiles for which the catalogue's own backtracking placer finds room is a mix
    # of some enumerated geometry, and no other mix is.
    mixes = {g.counts for g in geometries}
    profiles = gpu.mig.profiles
    ranges = [range(p.max_instances + 1) for p in profiles]
    expected = set()
    for counts in itertools.product(*ranges):
        names = [p.name for p, n in zip(profiles, counts, strict=True) for _ in range(n)]
        if gpu.mig.fits(names):
            expected.add(tuple(sorted(Counter(names).items())))
    assert mixes == expected


def test_the_mig_user_guide_examples_are_maximal_geometries_of_the_a100() -> None:
    # Partitions the MIG user guide draws for A100-80GB (7 compute / 8 memory slices).
    maximal = {g.counts for g in maximal_geometries(A100)}
    for mix in [
        (("7g.80gb", 1),),
        (("3g.40gb", 1), ("4g.40gb", 1)),
        (("3g.40gb", 2),),
        (("2g.20gb", 2), ("3g.40gb", 1)),
        (("1g.10gb", 1), ("2g.20gb", 3)),
        (("1g.10gb", 7),),
        (("1g.20gb", 4),),
    ]:
        assert mix in maximal
    mixes = {g.counts for g in enumerate_geometries(A100)}
    assert (("4g.40gb", 2),) not in mixes  # 4g.40gb has one placement
    assert (("3g.40gb", 2), ("1g.10gb", 1)) not in mixes  # no memory slice left
    assert enumerate_geometries(model("T4")) == ()


def test_supporting_models_names_the_models_with_a_profile() -> None:
    models = [A100, A30, model("H100-80GB"), model("T4")]
    assert supporting_models("3g.40gb", models) == ["A100-80GB", "H100-80GB"]
    assert supporting_models("2g.12gb", models) == ["A30"]
    assert supporting_models("1g.5gb", models) == []


def _brute_best(
    gpu: GpuModel, demand: dict[str, int], held: frozenset[MigSlice], current: frozenset[MigSlice]
) -> tuple[int, int, int, int, int]:
    best = None
    for subset in _brute_force_geometries(gpu) if gpu is A30 else ():
        if not held <= subset:
            continue
        score, _ = score_geometry(gpu, tuple(sorted(subset)), demand, held, current)
        best = score if best is None else max(best, score)
    assert best is not None
    return best


def test_exact_single_gpu_plan_equals_brute_force_on_the_a30() -> None:
    rng = random.Random(7)
    assert A30.mig is not None
    names = [p.name for p in A30.mig.profiles]
    all_geometries = enumerate_geometries(A30)
    for _ in range(150):
        demand = {name: rng.randint(0, 3) for name in names}
        current = rng.choice(all_geometries)
        held = frozenset(s for s in current.slices if rng.random() < 0.4)
        plan = best_geometry(A30, demand, held, GpuLayout.mig_geometry(current.slices))
        assert plan.score == _brute_best(A30, demand, held, frozenset(current.slices))
        assert held <= set(plan.geometry.slices)
        for profile, n in plan.served.items():
            assert n <= demand[profile]


def test_exact_single_gpu_plan_matches_exhaustive_mixes_on_the_a100() -> None:
    rng = random.Random(11)
    assert A100.mig is not None
    mig = A100.mig
    profiles = [p for p in mig.profiles if not p.media_extensions]
    fitting = [
        counts
        for counts in itertools.product(*[range(p.max_instances + 1) for p in profiles])
        if mig.fits([p.name for p, n in zip(profiles, counts, strict=True) for _ in range(n)])
    ]
    for _ in range(60):
        demand = {p.name: rng.randint(0, 3) for p in profiles}
        plan = best_geometry(A100, demand)
        best_served = max(
            sum(min(n, demand[p.name]) * p.compute_slices for p, n in zip(profiles, counts, strict=True))
            for counts in fitting
        )
        assert plan.served_compute == best_served


def test_held_slices_are_kept_and_serve_no_pending_pod() -> None:
    held = frozenset({MigSlice(4, "3g.40gb")})
    plan = best_geometry(A100, {"3g.40gb": 2, "4g.40gb": 1}, held)
    assert MigSlice(4, "3g.40gb") in plan.geometry.slices
    assert plan.served == {"4g.40gb": 1}
    with pytest.raises(InvalidLayout, match="no valid A100-80GB geometry contains them"):
        best_geometry(A100, {}, frozenset({MigSlice(0, "4g.40gb"), MigSlice(0, "3g.40gb")}))
    with pytest.raises(InvalidLayout, match="does not support MIG"):
        best_geometry(model("T4"), {"1g.10gb": 1})


def test_equal_answers_keep_the_current_geometry() -> None:
    current = GpuLayout.mig_geometry([("1g.10gb", 6), ("3g.40gb", 0)])
    plan = best_geometry(A100, {"1g.10gb": 1, "3g.40gb": 1}, current=current)
    assert plan.layout == current
