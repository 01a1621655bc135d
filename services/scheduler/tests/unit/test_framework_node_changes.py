"""A cycle looks only at the nodes the cache changed since its pod shape was last decided.

The cache logs each node it replaces, adds or removes (:class:`NodeChanges`) and keeps the cluster
totals node by node (:class:`RunningTotals`); the framework's kept verdicts then follow the log. Here
nodes also come and go, older snapshots are decided after newer ones and the log forgets its older
entries: every decision must still be the one of every node filtered and scored afresh, and the
totals the ones summed over every node.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from types import MappingProxyType

import pytest

from tessera.scheduler.domain import node_changes
from tessera.scheduler.domain.cache import SchedulerCache
from tessera.scheduler.domain.framework.builders import make_node, make_pod
from tessera.scheduler.domain.framework.cycle_state import CycleState
from tessera.scheduler.domain.framework.pod import PodSpec
from tessera.scheduler.domain.framework.runtime import Framework, Profile, WeightedScore
from tessera.scheduler.domain.gang.registry import GangRegistry
from tessera.scheduler.domain.node_changes import NodeChanges
from tessera.scheduler.domain.placement.observed_workload import OPENB_TYPICAL_WORKLOAD
from tessera.scheduler.domain.plugins.filters import GPU_CHOICE, GpuFit
from tessera.scheduler.domain.plugins.fragmentation import FragmentationScore
from tessera.scheduler.domain.plugins.gpu_choice import choose_gpus
from tessera.scheduler.domain.plugins.profiles import build_profile
from tessera.scheduler.domain.plugins.reserve import RecordingBinder
from tessera.scheduler.domain.snapshot import Allocation, NodeInfo, Snapshot

from .test_framework_verdicts import MODELS, SHAPES, cluster, same


def test_the_log_names_the_nodes_changed_after_a_generation() -> None:
    log = NodeChanges(limit=4)
    for generation, name in enumerate("abcab", start=1):
        log.record(generation, name)
    assert log.since(5) == set()
    assert log.since(3) == {"a", "b"}
    # four entries kept at most: the oldest half went when the fifth came, so generation 1 is unknown
    assert log.since(1) is None and log.since(2) == {"c", "a", "b"}
    with pytest.raises(ValueError, match="older"):
        log.record(4, "c")


def test_a_cache_snapshot_names_what_changed_since_an_older_one() -> None:
    cache = SchedulerCache.rebuild([make_node(f"n{i}").gpus(2).build() for i in range(3)])
    first = cache.snapshot()
    cache.set_schedulable("n1", False)
    cache.upsert_node(make_node("n9").gpus(1).build())
    second = cache.snapshot()
    log = second.changes
    assert log is not None and log is first.changes
    assert log.since(first.generation) == {"n1", "n9"}
    assert list(second.positions()) == ["n0", "n1", "n2", "n9"]


def random_event(rng: random.Random, cache: SchedulerCache, nodes: list[NodeInfo], placed: list[str]) -> None:
    """Pods leave, GPUs fail, nodes are cordoned, removed and added again."""
    event = rng.random()
    live = [node for node in nodes if node.name in cache.snapshot().nodes]
    if event < 0.3 and placed:
        cache.remove_pod(placed.pop(rng.randrange(len(placed))))
    elif event < 0.35 and live:
        node = rng.choice([n for n in live if n.gpus] or live)
        if node.gpus:
            cache.set_gpu_health(node.name, rng.randrange(node.gpu_count), rng.random() < 0.5)
    elif event < 0.4 and live:
        cache.set_schedulable(rng.choice(live).name, rng.random() < 0.6)
    elif event < 0.45 and len(live) > 10:
        gone = rng.choice(live).name
        cache.remove_node(gone)
        placed[:] = [pod for pod in placed if cache.allocation(pod) is not None]
    elif event < 0.5:
        back = rng.choice(nodes)
        cache.upsert_node(back)


@pytest.mark.parametrize(("seed", "log_limit"), [(1, None), (2, None), (3, 6)])
def test_kept_verdicts_follow_nodes_that_come_and_go(
    seed: int, log_limit: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if log_limit is not None:  # a short log: shapes not seen for a while look at every node
        monkeypatch.setattr(node_changes, "MAX_LOGGED_CHANGES", log_limit)
    rng = random.Random(seed)
    nodes = cluster(rng, 50)
    cache = SchedulerCache.rebuild(nodes)
    fragmentation = FragmentationScore(OPENB_TYPICAL_WORKLOAD, MODELS)
    profile = build_profile(
        cache, GangRegistry(), RecordingBinder(), gangs=False, fragmentation=fragmentation
    )
    kept, afresh = Framework(profile), Framework(profile, max_verdicts=0)
    placed: list[str] = []
    older: Snapshot | None = None
    decisions = 0
    for i in range(400):
        pod = make_pod(f"p{i}", f"gang-{i // 3}", **SHAPES[rng.randrange(len(SHAPES))])  # type: ignore[arg-type]
        if older is not None and rng.random() < 0.1:
            # an older snapshot decided after newer ones: nothing is reserved on it
            state = CycleState()
            same(kept.schedule_pod(state, pod, older), afresh.schedule_pod(CycleState(), pod, older))
        snapshot = cache.snapshot()
        older = snapshot if rng.random() < 0.2 else older
        fast, slow = CycleState(), CycleState()
        result = kept.schedule_pod(fast, pod, snapshot)
        same(result, afresh.schedule_pod(slow, pod, snapshot))
        if result.node is not None:
            decisions += 1
            if pod.gpu_count:
                assert fast.read(GPU_CHOICE)[result.node] == slow.read(GPU_CHOICE)[result.node]
            assert kept.run_reserve(fast, pod, result.node).ok
            placed.append(pod.name)
        random_event(rng, cache, nodes, placed)
    assert decisions > 150, "the workload should place most pods"


def test_the_cache_keeps_the_totals_and_the_gangs_nodes_as_every_node_says() -> None:
    rng = random.Random(11)
    nodes = cluster(rng, 40)
    cache = SchedulerCache.rebuild(nodes)
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    placed: list[str] = []
    snapshots: list[Snapshot] = []
    for i in range(300):
        snapshot = cache.snapshot()
        snapshots.append(snapshot)
        walked = Snapshot.of(snapshot.nodes.values())
        assert snapshot.totals == walked.totals
        for older in (snapshot, rng.choice(snapshots)):  # an older one: nodes changed since it
            for gang in {f"gang-{rng.randrange(i // 3 + 1)}" for _ in range(3)}:
                assert older.holding(gang) == Snapshot.of(older.nodes.values()).holding(gang)
        pod = make_pod(f"p{i}", f"gang-{i // 3}", **SHAPES[rng.randrange(len(SHAPES))])  # type: ignore[arg-type]
        state = CycleState()
        result = framework.schedule_pod(state, pod, snapshot)
        if result.node is not None and framework.run_reserve(state, pod, result.node).ok:
            placed.append(pod.name)
        random_event(rng, cache, nodes, placed)


def test_gpu_fit_chooses_on_each_node_what_choose_gpus_chooses_there() -> None:
    """GpuFit keeps the GPUs it chose per node and GPU request: pods of other CPU or memory asking
    the same GPUs of a node that has not changed get that set, and a changed node is chosen afresh."""
    rng = random.Random(5)
    nodes = cluster(rng, 30)
    cache = SchedulerCache.rebuild(nodes)
    profile = build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False)
    framework, gpu_fit = Framework(profile), next(p for p in profile.filter if isinstance(p, GpuFit))
    placed: list[str] = []
    compared = 0
    for i in range(300):
        shape = dict(SHAPES[rng.randrange(len(SHAPES))], cpu_milli=rng.choice((1000, 2000, 4000)))
        pod = make_pod(f"p{i}", f"p{i}", **shape)  # type: ignore[arg-type]
        state = CycleState()
        snapshot = cache.snapshot()
        result = framework.schedule_pod(state, pod, snapshot)
        if pod.gpu_count:
            chosen = state.read(GPU_CHOICE)
            for node in snapshot.nodes.values():
                if node.name in chosen:
                    assert chosen[node.name] == choose_gpus(pod, node, gpu_fit.policy(pod))
                    compared += 1
        if result.node is not None and framework.run_reserve(state, pod, result.node).ok:
            placed.append(pod.name)
        random_event(rng, cache, nodes, placed)
    assert compared > 1000


class _Scores:
    """A Score plugin answering ``value`` for every node, or, sparse, naming ``names``."""

    def __init__(self, value: int, names: tuple[str, ...] = ()) -> None:
        self.name, self.value, self.names = "Fixed", value, names

    def score(self, state: CycleState, pod: PodSpec, node: NodeInfo) -> int:
        return self.value

    def sparse_score(self, state: CycleState, pod: PodSpec, nodes: Mapping[str, NodeInfo]) -> dict[str, int]:
        return dict.fromkeys(self.names, self.value)


class _DenseScores(_Scores):
    sparse_score = None  # type: ignore[assignment]


def test_a_score_outside_the_range_or_for_a_node_not_scored_is_refused() -> None:
    nodes = [make_node(f"n{i}").gpus(1).build() for i in range(3)]
    pod = make_pod("p", "p")

    def score(plugin: _Scores) -> dict[str, int]:
        return Framework(Profile(score=[WeightedScore(plugin, 2)])).run_score(CycleState(), pod, nodes)

    assert score(_DenseScores(30)) == {"n0": 60, "n1": 60, "n2": 60}
    assert score(_Scores(30, ("n1",))) == {"n0": 0, "n1": 60, "n2": 0}
    with pytest.raises(ValueError, match=r"outside 0\.\.100"):
        score(_DenseScores(101))
    with pytest.raises(ValueError, match=r"outside 0\.\.100"):
        score(_Scores(-1, ("n0",)))
    with pytest.raises(ValueError, match="not among the nodes scored"):
        score(_Scores(10, ("elsewhere",)))


def test_a_snapshot_made_from_the_caches_does_not_carry_its_log_of_changes() -> None:
    """A what-if snapshot made with ``dataclasses.replace`` (a node freed, two cordoned) is decided as
    a snapshot of its own: the kept verdicts and the gang index walk its nodes. Before, it carried
    the cache's log, which names none of its changes, so the kept path chose a cordoned node and
    `holding` named a node the gang was no longer on."""
    cache = SchedulerCache.rebuild([make_node(f"n{i}").gpus(2).build() for i in range(3)])
    cache.assume(Allocation("x", "gx", "n0", ((0, 1000), (1, 1000))))  # n0 full
    profile = build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False)
    kept = Framework(profile)
    pod = make_pod("p", "g", gpus=2)
    snapshot = cache.snapshot()
    assert kept.schedule_pod(CycleState(), pod, snapshot).node in {"n1", "n2"}

    nodes = dict(snapshot.nodes)
    nodes["n0"] = nodes["n0"].without_allocation(cache.allocation("x"))
    for name in ("n1", "n2"):
        nodes[name] = dataclasses.replace(nodes[name], schedulable=False)
    what_if = dataclasses.replace(snapshot, nodes=MappingProxyType(nodes))
    assert what_if.changes is None and what_if.gangs is None
    assert kept.schedule_pod(CycleState(), pod, what_if).node == "n0"
    assert what_if.holding("gx") == frozenset()
