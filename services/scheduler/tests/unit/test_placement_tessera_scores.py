"""Tessera's policy keeps each node's score until the node changes; its decisions on a seeded sample
are the same as scoring every feasible node from scratch at every decision, as the policy is defined."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.scheduler.domain.placement import (
    ClusterState,
    FragmentationModel,
    NodeSpec,
    Placement,
    PodShape,
    TesseraPolicy,
    WorkloadProfile,
)
from tessera.scheduler.domain.placement.choice import pick_best, random_ranks, whole_gpus
from tessera.scheduler.domain.placement.fgd import fragmentation_change
from tessera.scheduler.domain.placement.replay import arrival_sequence

MODELS = ("V100", "A100", "T4")


class FromScratch:
    """The policy's definition, every node scored again at every decision (no cache)."""

    def __init__(self, policy: TesseraPolicy, model: FragmentationModel, rank: np.ndarray) -> None:
        self.policy, self.model, self.rank = policy, model, rank

    def choose(self, state: ClusterState, pod: PodShape) -> Placement | None:
        nodes = np.flatnonzero(state.feasible(pod))
        if nodes.size == 0:
            return None
        change = np.round(fragmentation_change(self.model, state, nodes, pod), 6)
        best = np.argmin(change, axis=1)
        if pod.is_sharing:
            top = change <= change[np.arange(nodes.size), best][:, None]
            best = np.argmin(np.where(top, state.gpu_left[nodes], np.iinfo(np.int64).max), axis=1)
        cost = change[np.arange(nodes.size), best] + self.policy.stranding_change(state, nodes, pod)
        node = pick_best(nodes, -np.round(cost, 6), self.rank)
        if pod.is_sharing:
            return Placement(node, (int(best[np.searchsorted(nodes, node)]),))
        return Placement(node, whole_gpus(state, node, pod.num_gpu))


def sample(seed: int) -> tuple[list[NodeSpec], list[PodShape]]:
    """A seeded cluster of mixed nodes and a pod list of every kind: sharing, whole and multi-GPU,
    CPU-only and model-constrained pods, with shapes that differ only in memory."""
    rng = np.random.default_rng(seed)
    nodes = [
        NodeSpec(
            f"n{i}",
            int(rng.choice([32_000, 64_000, 96_000, 128_000])),
            int(rng.choice([32_768, 65_536, 131_072])),
            int(rng.choice([0, 1, 2, 4, 8])),
            MODELS[int(rng.integers(len(MODELS)))],
        )
        for i in range(150)
    ]
    pods = []
    for _ in range(300):
        kind = rng.integers(5)
        cpu = int(rng.choice([1_000, 4_000, 8_000, 16_000, 32_000]))
        memory = int(rng.choice([2_048, 8_192, 16_384, 32_768]))
        if kind == 0:
            pods.append(PodShape(cpu, memory))
        elif kind == 1:
            pods.append(PodShape(cpu, memory, 1, int(rng.choice([100, 250, 460, 500, 700]))))
        elif kind == 2:
            pods.append(PodShape(cpu, memory, int(rng.choice([1, 2, 4, 8])), 1000))
        else:
            models = frozenset(rng.choice(MODELS, size=2, replace=False).tolist())
            pods.append(PodShape(cpu, memory, 1, int(rng.choice([300, 1000])), models))
    return nodes, pods


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cached_scores_make_the_same_decisions_as_scoring_from_scratch(seed: int) -> None:
    nodes, pods = sample(seed)
    profile = WorkloadProfile.from_pods(pods)
    capacity = ClusterState(nodes).gpu_capacity_milli
    arrivals = [pods[i] for i in arrival_sequence(pods, capacity, seed)]
    decisions = {}
    for name in ("cached", "from scratch"):
        state = ClusterState(nodes)
        model = FragmentationModel(profile.typical, state)
        rank = random_ranks(state.num_nodes, seed)
        policy = TesseraPolicy(model, profile, rank)
        chooser = policy if name == "cached" else FromScratch(policy, model, rank)
        made = []
        for pod in arrivals:
            placement = chooser.choose(state, pod)
            made.append(placement)
            if placement is not None:
                state.apply(pod, placement)
        decisions[name] = made
    assert sum(d is not None for d in decisions["cached"]) > len(arrivals) / 2
    assert any(d is None for d in decisions["cached"]), "the sample reaches saturation"
    assert decisions["cached"] == decisions["from scratch"]
