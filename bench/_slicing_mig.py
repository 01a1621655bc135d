"""B5 MIG part: the exact single-GPU plan against exhaustive search, and the cluster plan against
its lower bound, on seeded mixes of profile requests (see bench/slicing.py)."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from functools import cache
from typing import Any

from tessera.cluster.catalogue import GpuModel, MigGeometry, model
from tessera.cluster.domain.gpu import MigInstance
from tessera.slicing.domain.cluster_plan import GpuState, NodeState, plan_cluster
from tessera.slicing.domain.demand import PodShape
from tessera.slicing.domain.geometry import enumerate_geometries
from tessera.slicing.domain.layout import GpuLayout, MigSlice, SharingMode
from tessera.slicing.domain.single_gpu import best_geometry, score_geometry

MIG_MODELS = ("A100-80GB", "H100-80GB")
GOALS = {"mig_cluster_ratio": 1.10, "mig_ms_per_node": 50.0}


def exhaustive_geometries(name: str) -> tuple[frozenset[MigSlice], ...]:
    """Every subset of (profile, placement) pairs the catalogue accepts, searched pair by pair."""
    gpu = model(name)
    assert gpu.mig is not None
    return _exhaustive(gpu.mig)


@cache
def _exhaustive(mig: MigGeometry) -> tuple[frozenset[MigSlice], ...]:
    pairs = [MigSlice(start, p.name) for p in mig.profiles for start in p.placements]
    found: list[frozenset[MigSlice]] = []

    def walk(i: int, chosen: list[MigSlice]) -> None:
        if not mig.is_valid(MigInstance(s.profile, s.start) for s in chosen):
            return  # every superset of an invalid set is invalid too
        if i == len(pairs):
            found.append(frozenset(chosen))
            return
        walk(i + 1, chosen)
        walk(i + 1, [*chosen, pairs[i]])

    walk(0, [])
    return tuple(found)


def _profiles(gpu: GpuModel) -> list[str]:
    assert gpu.mig is not None
    return [p.name for p in gpu.mig.profiles]


def run_single_gpu(name: str, cases: int, seed: int) -> dict[str, Any]:
    gpu = model(name)
    rng = random.Random(seed)
    everything = exhaustive_geometries(name)
    geometries = enumerate_geometries(gpu)
    optimal = 0
    plan_ms: list[float] = []
    for _ in range(cases):
        demand = {p: rng.choice((0, 0, 1, 1, 2, 3)) for p in _profiles(gpu)}
        current = rng.choice(geometries)
        held = frozenset(s for s in current.slices if rng.random() < 0.3)
        started = time.perf_counter()
        plan = best_geometry(gpu, demand, held, GpuLayout.mig_geometry(current.slices))
        plan_ms.append(1000 * (time.perf_counter() - started))
        best = max(
            score_geometry(gpu, tuple(sorted(subset)), demand, held, frozenset(current.slices))[0]
            for subset in everything
            if held <= subset
        )
        optimal += plan.score == best
    return {
        "model": name,
        "geometries": len(geometries),
        "exhaustive_geometries": len(everything),
        "cases": cases,
        "optimal_cases": optimal,
        "plan_ms_p50": round(statistics.median(plan_ms), 3),
        "plan_ms_max": round(max(plan_ms), 3),
    }


def _mig_mix(gpu: GpuModel, rng: random.Random, gpus_worth: float) -> Counter[str]:
    assert gpu.mig is not None
    plain = [p for p in gpu.mig.profiles if not p.media_extensions]
    weights = [4, 2, 3, 3, 1, 1][: len(plain)]
    mix: Counter[str] = Counter()
    compute = 0
    while compute < gpus_worth * gpu.mig.compute_slices:
        profile = rng.choices(plain, weights=weights)[0]
        mix[profile.name] += 1
        compute += profile.compute_slices
    return mix


def run_cluster(
    name: str, node_counts: Sequence[int], seeds: Sequence[int], fill: float
) -> list[dict[str, Any]]:
    gpu = model(name)
    assert gpu.mig is not None
    rows = []
    for nodes_n in node_counts:
        for seed in seeds:
            rng = random.Random(seed * 1000 + nodes_n)
            mix = _mig_mix(gpu, rng, fill * nodes_n * 8)
            nodes = [
                NodeState(f"n{i:04d}", tuple(GpuState(j, gpu, GpuLayout.exclusive()) for j in range(8)))
                for i in range(nodes_n)
            ]
            demand = {PodShape.mig(p): n for p, n in mix.items()}
            started = time.perf_counter()
            plan = plan_cluster(nodes, demand)
            elapsed_ms = 1000 * (time.perf_counter() - started)
            compute = sum(gpu.mig.profile(p).compute_slices * n for p, n in mix.items())
            memory = sum(gpu.mig.profile(p).memory_slices * n for p, n in mix.items())
            bound = max(
                math.ceil(compute / gpu.mig.compute_slices), math.ceil(memory / gpu.mig.memory_slices)
            )
            used = sum(1 for c in plan.changes if c.desired.mode is SharingMode.MIG)
            rows.append(
                {
                    "model": name,
                    "nodes": nodes_n,
                    "seed": seed,
                    "pods": sum(mix.values()),
                    "pods_placeable": plan.score.pods_placeable,
                    "gpus": used,
                    "lower_bound": bound,
                    "ratio": round(used / bound, 4),
                    "ms_per_node": round(elapsed_ms / nodes_n, 2),
                }
            )
    return rows


def run_mig(cases: int, node_counts: Sequence[int], seeds: Sequence[int], fill: float) -> dict[str, Any]:
    single = [run_single_gpu(name, cases, seed=7 + i) for i, name in enumerate(MIG_MODELS)]
    cluster = [row for name in MIG_MODELS for row in run_cluster(name, node_counts, seeds, fill)]
    ratio_max = max(r["ratio"] for r in cluster)
    ms_max = max(r["ms_per_node"] for r in cluster)
    all_served = all(r["pods_placeable"] == r["pods"] for r in cluster)
    return {
        "cases": sum(s["cases"] for s in single),
        "optimal_cases": sum(s["optimal_cases"] for s in single),
        "single_gpu": single,
        "cluster_ratio_mean": round(statistics.fmean(r["ratio"] for r in cluster), 4),
        "cluster_ratio_max": ratio_max,
        "cluster_all_pods_placeable": all_served,
        "ms_per_node_max": ms_max,
        "cluster": cluster,
        "goals": {"cluster_ratio": GOALS["mig_cluster_ratio"], "ms_per_node": GOALS["mig_ms_per_node"]},
        "meets_goal": all(s["optimal_cases"] == s["cases"] for s in single)
        and ratio_max <= GOALS["mig_cluster_ratio"]
        and ms_max <= GOALS["mig_ms_per_node"]
        and all_served,
    }
