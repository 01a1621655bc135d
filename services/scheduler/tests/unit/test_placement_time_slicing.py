"""Shares on GPUs slicing time-sliced: placed by free replicas, as the device plugin does (ADR 0021).

A GPU of N replicas takes N shares whatever their milli; a whole-GPU pod never joins pods there;
exclusive GPUs (and time-slicing set by hand, or MPS) keep counting shares by milli within 1000.
"""

from __future__ import annotations

import pytest

from tessera.cluster.builders import gpu_node
from tessera.cluster.conventions.names import (
    DEVICE_PLUGIN_CONFIG_LABEL,
    GPU_REPLICAS_LABEL,
    GPU_SHARING_STRATEGY_LABEL,
    SLICING_DEVICE_PLUGIN_CONFIG_PREFIX,
)
from tessera.scheduler.domain.cache import CacheConflict, SchedulerCache
from tessera.scheduler.domain.framework.builders import make_pod
from tessera.scheduler.domain.framework.cluster_view import node_info, placement_replicas
from tessera.scheduler.domain.framework.cycle_state import CycleState
from tessera.scheduler.domain.framework.pod import PodSpec, Policy
from tessera.scheduler.domain.framework.runtime import Framework
from tessera.scheduler.domain.gang.registry import GangRegistry
from tessera.scheduler.domain.plugins.filters import GPU_CHOICE
from tessera.scheduler.domain.plugins.profiles import build_profile
from tessera.scheduler.domain.plugins.reserve import RecordingBinder
from tessera.scheduler.domain.snapshot import Allocation, NodeInfo

SLICED_BY_SLICING = f"{SLICING_DEVICE_PLUGIN_CONFIG_PREFIX}0123abcd"


def sliced(
    replicas: int, gpus: int = 1, config: str = SLICED_BY_SLICING, strategy: str = "time-slicing"
) -> NodeInfo:
    """A node whose device plugin time-slices its GPUs into ``replicas``, labelled as GFD labels it."""
    labels = {
        GPU_SHARING_STRATEGY_LABEL: strategy,
        GPU_REPLICAS_LABEL: str(replicas),
        DEVICE_PLUGIN_CONFIG_LABEL: config,
    }
    return node_info(gpu_node("n1", "A100-80GB", gpus, replicas=replicas, labels=labels))


def exclusive(gpus: int = 1) -> NodeInfo:
    return node_info(gpu_node("n1", "A100-80GB", gpus))


def cache_of(node: NodeInfo) -> SchedulerCache:
    cache = SchedulerCache()
    cache.upsert_node(node)
    return cache


def place(cache: SchedulerCache, pod: PodSpec) -> tuple[tuple[int, int], ...] | None:
    """One cycle of the default profile; the chosen (GPU, milli) are assumed in the cache."""
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    state = CycleState()
    result = framework.schedule_pod(state, pod, cache.snapshot())
    if result.node is None:
        return None
    choice = state.read(GPU_CHOICE)[result.node]
    cache.assume(Allocation(pod.name, pod.gang, result.node, choice))
    return choice


def shares(
    cache: SchedulerCache, count: int, milli: int, prefix: str = "p"
) -> list[tuple[tuple[int, int], ...] | None]:
    return [place(cache, make_pod(f"{prefix}{i}", f"{prefix}{i}", milli=milli)) for i in range(count)]


@pytest.mark.parametrize("replicas", [4, 2])
def test_a_gpu_of_n_replicas_takes_n_shares_of_600_milli_and_no_more(replicas: int) -> None:
    cache = cache_of(sliced(replicas))
    placed = shares(cache, replicas + 1, 600)
    assert placed[:replicas] == [((0, 600),)] * replicas
    assert placed[replicas] is None, "every replica is held"
    gpu = cache.node("n1").gpus[0]
    assert (gpu.replicas_used, gpu.milli_used) == (replicas, 600 * replicas)
    assert gpu.idle_milli == 0 and not cache.node("n1").free_replica


def test_an_exclusive_gpu_still_counts_shares_by_milli() -> None:
    cache = cache_of(exclusive())
    assert shares(cache, 2, 600) == [((0, 600),), None]
    assert place(cache, make_pod("small", milli=400)) == ((0, 400),), "400 milli are left"
    assert place(cache, make_pod("tiny", milli=1)) is None
    assert cache.node("n1").gpus[0].replicas == 1


@pytest.mark.parametrize(
    ("config", "strategy"),
    [("ts-4", "time-slicing"), (SLICED_BY_SLICING, "mps")],
    ids=["time-slicing set by hand", "mps"],
)
def test_sharing_slicing_did_not_choose_keeps_the_milli_accounting(config: str, strategy: str) -> None:
    cache = cache_of(sliced(4, config=config, strategy=strategy))
    assert cache.node("n1").gpus[0].replicas == 1
    assert shares(cache, 2, 200) == [((0, 200),), ((0, 200),)]
    assert place(cache, make_pod("big", milli=700)) is None, "700 more would pass 1000 milli"


def test_a_whole_gpu_pod_never_joins_shares_on_a_time_sliced_gpu_and_shares_never_join_it() -> None:
    cache = cache_of(sliced(4, gpus=2))
    assert place(cache, make_pod("share", milli=300)) is not None
    assert place(cache, make_pod("whole")) == ((1, 1000),), "the GPU with a share on it is not taken"
    assert place(cache, make_pod("whole-2")) is None, "no time-sliced GPU is empty"
    # The whole pod holds all four replicas of GPU 1: the next shares go to GPU 0 only.
    assert shares(cache, 4, 300, prefix="q") == [((0, 300),)] * 3 + [None]
    with pytest.raises(CacheConflict, match="replicas"):
        cache.assume(Allocation("forced", "forced", "n1", ((1, 100),)))


def test_binpack_fills_the_gpu_with_the_fewest_free_replicas_and_spread_the_most() -> None:
    cache = cache_of(sliced(4, gpus=2))
    cache.assume(Allocation("first", "first", "n1", ((1, 500),)))
    assert place(cache, make_pod("b", milli=800, gpu_policy=Policy.BINPACK)) == ((1, 800),)
    assert place(cache, make_pod("s", milli=800, gpu_policy=Policy.SPREAD)) == ((0, 800),)


def test_replicas_grown_under_running_shares_take_more_of_them() -> None:
    cache = cache_of(sliced(2))
    assert shares(cache, 3, 600) == [((0, 600),), ((0, 600),), None]
    cache.upsert_node(sliced(4))  # slicing grows the replicas; the two pods keep theirs
    gpu = cache.node("n1").gpus[0]
    assert (gpu.replicas, gpu.replicas_used) == (4, 2)
    assert shares(cache, 3, 600, prefix="more") == [((0, 600),), ((0, 600),), None]


def test_a_malformed_replica_label_counts_shares_by_milli() -> None:
    labels = {
        GPU_SHARING_STRATEGY_LABEL: "time-slicing",
        GPU_REPLICAS_LABEL: "many",
        DEVICE_PLUGIN_CONFIG_LABEL: SLICED_BY_SLICING,
    }
    assert placement_replicas(labels) == 1
    assert placement_replicas({**labels, GPU_REPLICAS_LABEL: "0"}) == 1
    assert placement_replicas({**labels, GPU_REPLICAS_LABEL: "3"}) == 3
