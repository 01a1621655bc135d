"""Filter and score plugins through the default profile: GPU choice, topology, policies, MIG, health."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tessera.cluster.domain.node import Taint, TaintEffect, Toleration, TolerationOperator
from tessera.scheduler.domain.cache import SchedulerCache
from tessera.scheduler.domain.framework.builders import make_node, make_pod
from tessera.scheduler.domain.framework.cycle_state import CycleState
from tessera.scheduler.domain.framework.pod import PodSpec, Policy
from tessera.scheduler.domain.framework.runtime import Framework
from tessera.scheduler.domain.gang.registry import GangRegistry
from tessera.scheduler.domain.placement import TypicalPod
from tessera.scheduler.domain.plugins.args import PluginArgsError
from tessera.scheduler.domain.plugins.filters import GPU_CHOICE
from tessera.scheduler.domain.plugins.fragmentation import FragmentationScore
from tessera.scheduler.domain.plugins.gpu_choice import best_gpu_set, choose_gpus
from tessera.scheduler.domain.plugins.profiles import build_profile
from tessera.scheduler.domain.plugins.reserve import RecordingBinder
from tessera.scheduler.domain.snapshot import Allocation, NodeInfo, Topology

# An 8-GPU SXM board wired in NVLink pairs, two NUMA nodes of four GPUs each.
PAIRS = ((0, 1), (2, 3), (4, 5), (6, 7))
NUMA = (0, 0, 0, 0, 1, 1, 1, 1)


def sxm_node(name: str = "n1") -> NodeInfo:
    return make_node(name).gpus(8, model="A100-80GB").nvlink_pairs(*PAIRS).numa(*NUMA).build()


def occupy(cache: SchedulerCache, node: str, gpus: dict[int, int], pod: str | None = None) -> None:
    """Put a foreign pod on ``node`` holding ``milli`` of each GPU index."""
    name = pod or f"busy-{node}-{'-'.join(map(str, gpus))}"
    cache.assume(Allocation(name, "other", node, tuple(sorted(gpus.items()))))


def place(cache: SchedulerCache, pod: PodSpec) -> tuple[str | None, tuple[int, ...], CycleState]:
    """One cycle through the default profile without gangs; the chosen node and GPU indices."""
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    state = CycleState()
    result = framework.schedule_pod(state, pod, cache.snapshot())
    if result.node is None:
        return None, (), state
    return result.node, tuple(index for index, _ in state.read(GPU_CHOICE).get(result.node, ())), state


@pytest.mark.parametrize(
    ("k", "busy", "policy", "expected"),
    [
        # A pair stays on an NVLink pair, never a PCIe-only pair like (1, 3).
        (2, {0, 2}, Policy.BINPACK, (4, 5)),
        # Four GPUs stay in one NUMA node rather than straddle the sockets.
        (4, {0, 2}, Policy.BINPACK, (4, 5, 6, 7)),
        # One GPU: binpack takes a GPU whose NVLink peer is busy, keeping whole pairs free...
        (1, {0, 2}, Policy.BINPACK, (1,)),
        # ...spread takes one from an intact pair.
        (1, {0, 2}, Policy.SPREAD, (4,)),
        # Only cross-NUMA pairs left: take one anyway.
        (2, {0, 1, 2, 5, 6, 7}, Policy.BINPACK, (3, 4)),
        (8, set(), Policy.BINPACK, tuple(range(8))),
        (3, set(range(6)), Policy.BINPACK, None),
    ],
)
def test_nvlink_aware_choice_on_an_8_gpu_sxm_board(
    k: int, busy: set[int], policy: Policy, expected: tuple[int, ...] | None
) -> None:
    cache = SchedulerCache.rebuild([sxm_node()])
    if busy:
        occupy(cache, "n1", dict.fromkeys(busy, 1000))
    node, gpus, _ = place(cache, make_pod("p", gpus=k, gpu_policy=policy))
    assert (gpus if node else None) == expected


def test_nvswitch_board_sets_all_cost_the_same_and_take_the_lowest_indices() -> None:
    topology = Topology.nvswitch(8)
    assert best_gpu_set(topology, (1, 3, 4, 6), 2, Policy.BINPACK) == (1, 3)


def test_greedy_search_past_the_limit_still_finds_an_nvlink_island() -> None:
    islands = [
        (a, b) for base in (0, 4, 8, 12) for a in range(base, base + 4) for b in range(a + 1, base + 4)
    ]
    topology = Topology.build(16, numa_of=[i // 8 for i in range(16)], nvlink_pairs=islands)
    chosen = best_gpu_set(topology, tuple(range(2, 16)), 4, Policy.BINPACK, exhaustive_limit=10)
    assert chosen is not None and topology.set_cost(chosen)[0] == 1


@pytest.mark.parametrize(
    ("policy", "expected_node"),
    [(Policy.BINPACK, "busy"), (Policy.SPREAD, "empty")],
)
def test_node_level_binpack_fills_the_busiest_node_and_spread_the_emptiest(
    policy: Policy, expected_node: str
) -> None:
    cache = SchedulerCache.rebuild([make_node("empty").gpus(8).build(), make_node("busy").gpus(8).build()])
    occupy(cache, "busy", {0: 1000, 1: 1000, 2: 1000, 3: 1000})
    node, _, _ = place(cache, make_pod("p", gpus=1, node_policy=policy))
    assert node == expected_node


def test_node_policy_default_comes_from_plugin_args() -> None:
    cache = SchedulerCache.rebuild([make_node("empty").gpus(8).build(), make_node("busy").gpus(8).build()])
    occupy(cache, "busy", {0: 1000})
    profile = build_profile(
        cache, GangRegistry(), RecordingBinder(), {"NodePolicy": {"default_policy": "spread"}}
    )
    framework = Framework(profile)
    result = framework.schedule_pod(CycleState(), make_pod("p", gpus=1), cache.snapshot())
    assert result.node is None  # the gang is not registered: Coscheduling refuses it
    no_gang = Framework(
        build_profile(
            cache,
            GangRegistry(),
            RecordingBinder(),
            {"NodePolicy": {"default_policy": "spread"}},
            gangs=False,
        )
    )
    assert no_gang.schedule_pod(CycleState(), make_pod("p", gpus=1), cache.snapshot()).node == "empty"


@pytest.mark.parametrize(
    ("policy", "expected_gpu"),
    [(Policy.BINPACK, 0), (Policy.SPREAD, 2)],
)
def test_gpu_level_binpack_takes_the_fullest_gpu_that_fits_and_spread_the_emptiest(
    policy: Policy, expected_gpu: int
) -> None:
    cache = SchedulerCache.rebuild([make_node("n1").gpus(3).build()])
    occupy(cache, "n1", {0: 500, 1: 800})
    _, gpus, _ = place(cache, make_pod("p", gpus=1, milli=300, gpu_policy=policy))
    assert gpus == (expected_gpu,)


@pytest.mark.parametrize(
    ("policy", "expected_usage"),
    [(Policy.BINPACK, [1000, 0]), (Policy.SPREAD, [500, 500])],
)
def test_fractional_pods_pack_into_one_gpu_or_spread_over_both(
    policy: Policy, expected_usage: list[int]
) -> None:
    cache = SchedulerCache.rebuild([make_node("n1").gpus(2).build()])
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    for i in range(4):
        pod = make_pod(f"p{i}", gang=f"g{i}", gpus=1, milli=250, gpu_policy=policy)
        state = CycleState()
        result = framework.schedule_pod(state, pod, cache.snapshot())
        assert result.node == "n1"
        assert framework.run_reserve(state, pod, result.node).ok
    assert [gpu.milli_used for gpu in cache.node("n1").gpus] == expected_usage


def test_a_share_does_not_fit_where_every_gpu_has_too_little_left() -> None:
    cache = SchedulerCache.rebuild([make_node("n1").gpus(2).build()])
    occupy(cache, "n1", {0: 800, 1: 900})
    node, _, _ = place(cache, make_pod("p", gpus=1, milli=300))
    assert node is None


def test_mig_profiles_are_filtered_by_free_devices() -> None:
    cache = SchedulerCache.rebuild(
        [
            make_node("small").gpus(0).mig({"1g.10gb": 2}).build(),
            make_node("large").gpus(0).mig({"3g.40gb": 1}).build(),
        ]
    )
    one = PodSpec.from_resources("p1", "g", {"nvidia.com/mig-1g.10gb": 1})
    assert place(cache, one)[0] == "small"
    big = PodSpec.from_resources("p2", "g", {"nvidia.com/mig-3g.40gb": 1})
    assert place(cache, big)[0] == "large"
    three = PodSpec.from_resources("p3", "g", {"nvidia.com/mig-1g.10gb": 3})
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    result = framework.schedule_pod(CycleState(), three, cache.snapshot())
    assert result.node is None and result.diagnosis is not None
    assert result.diagnosis.message() == "no free MIG device of the profile 1g.10gb on 2 nodes"


def test_reserved_mig_devices_are_no_longer_free() -> None:
    cache = SchedulerCache.rebuild([make_node("n1").gpus(0).mig({"1g.10gb": 1}).build()])
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    pod = PodSpec.from_resources("p1", "g", {"nvidia.com/mig-1g.10gb": 1})
    state = CycleState()
    assert framework.schedule_pod(state, pod, cache.snapshot()).node == "n1"
    assert framework.run_reserve(state, pod, "n1").ok
    assert cache.node("n1").mig_free("1g.10gb") == 0
    again = PodSpec.from_resources("p2", "g", {"nvidia.com/mig-1g.10gb": 1})
    assert place(cache, again)[0] is None


def test_unhealthy_gpus_are_never_chosen() -> None:
    cache = SchedulerCache.rebuild([make_node("n1").gpus(4).unhealthy(0, 1).build()])
    node, gpus, _ = place(cache, make_pod("p", gpus=2))
    assert (node, gpus) == ("n1", (2, 3))


def test_gpu_model_constraint() -> None:
    cache = SchedulerCache.rebuild(
        [make_node("t4").gpus(4, model="T4").build(), make_node("a100").gpus(4).build()]
    )
    assert place(cache, make_pod("p", gpus=1, models=["A100-80GB", "H100"]))[0] == "a100"
    assert place(cache, make_pod("p", gpus=1, models=["T4"]))[0] == "t4"


def test_diagnosis_counts_rejected_nodes_per_reason() -> None:
    nodes = [make_node(f"full{i}").gpus(8).build() for i in range(3)]
    nodes += [
        make_node("t4").gpus(8, model="T4").build(),
        make_node("sick").gpus(8).unhealthy(0, 1, 2).build(),
    ]
    nodes += [make_node("cordoned").gpus(8).cordoned().build()]
    cache = SchedulerCache.rebuild(nodes)
    for i in range(3):
        occupy(cache, f"full{i}", {g: 1000 for g in range(6)})
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    result = framework.schedule_pod(
        CycleState(), make_pod("p", gpus=6, models=["A100-80GB"]), cache.snapshot()
    )
    assert result.diagnosis is not None
    assert result.diagnosis.message() == (
        "insufficient GPU on 3 nodes; model not allowed on 1; node unschedulable on 1; unhealthy GPU on 1"
    )


def test_choose_gpus_with_no_gpu_request_takes_none() -> None:
    assert choose_gpus(make_pod("p", gpus=0), sxm_node(), Policy.BINPACK) == ()


def test_gpu_topology_score_prefers_the_node_with_an_nvlink_pair() -> None:
    pcie = make_node("pcie").gpus(8).numa(*NUMA).build()
    cache = SchedulerCache.rebuild([pcie, sxm_node("sxm")])
    assert place(cache, make_pod("p", gpus=2))[0] == "sxm"


@pytest.mark.parametrize(
    ("config", "field_path"),
    [
        ({"Coscheduling": {"permit_waiting_time_s": -1}}, "Coscheduling.permit_waiting_time_s"),
        ({"NodePolicy": {"default_policy": "scatter"}}, "NodePolicy.default_policy"),
        ({"GpuFit": {"exhaustive_limit": 0}}, "GpuFit.exhaustive_limit"),
        ({"GpuFit": {"bogus": 1}}, "GpuFit.bogus"),
        ({"weights": {"GpuTopology": 0}}, "weights.GpuTopology"),
        ({"Spreader": {}}, "profile.Spreader"),
    ],
)
def test_bad_plugin_args_name_the_plugin_and_field(
    config: dict[str, dict[str, object]], field_path: str
) -> None:
    with pytest.raises(PluginArgsError) as error:
        build_profile(SchedulerCache(), GangRegistry(), RecordingBinder(), config)
    assert field_path in error.value.fields
    assert field_path in str(error.value)


def test_a_pod_larger_than_any_node_is_refused_once_for_the_whole_cluster() -> None:
    cache = SchedulerCache.rebuild(
        [make_node("a").gpus(4).unhealthy(0).build(), make_node("b").gpus(2).build()]
    )
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    result = framework.schedule_pod(CycleState(), make_pod("p", gpus=5), cache.snapshot())
    assert result.diagnosis is not None and result.diagnosis.pre_filter is not None
    assert result.diagnosis.pre_filter.plugin == "GpuFit"
    assert result.diagnosis.message() == (
        "insufficient GPU on all 2 schedulable nodes (needs 5 idle GPUs, at most 4 on a node)"
    )
    # Four idle GPUs exist on "a", one of them unhealthy: that node is diagnosed one by one.
    per_node = framework.schedule_pod(CycleState(), make_pod("p", gpus=4), cache.snapshot())
    assert per_node.diagnosis is not None
    assert per_node.diagnosis.message() == "insufficient GPU on 1 node; unhealthy GPU on 1"


def test_unreserve_is_idempotent_and_bind_turns_an_assumption_into_a_bound_pod() -> None:
    cache = SchedulerCache.rebuild([sxm_node()])
    binder = RecordingBinder(fail_on=frozenset({2}))
    profile = build_profile(cache, GangRegistry(), binder, gangs=False)
    framework = Framework(profile)
    pods = [make_pod(f"p{i}", gang=f"g{i}", gpus=2) for i in range(2)]
    states = []
    for pod in pods:
        state = CycleState()
        node = framework.schedule_pod(state, pod, cache.snapshot()).node
        assert node == "n1" and framework.run_reserve(state, pod, node).ok
        states.append(state)
    assert framework.run_bind(states[0], pods[0], "n1").ok
    failed = framework.run_bind(states[1], pods[1], "n1")
    assert failed.plugin == "DefaultBinder" and "bind failed" in failed.reasons
    for _ in range(2):
        framework.run_unreserve(states[1], pods[1], "n1")
        framework.run_unreserve(states[0], pods[0], "n1")  # bound: Unreserve leaves it alone
    assert [a.pod for a in cache.allocations()] == ["p0"]
    assert cache.snapshot().node("n1").free_whole_gpus == 6


def fgd_plugin() -> FragmentationScore:
    # Half the workload wants a whole GPU, half wants half a GPU.
    typical = [
        TypicalPod(cpu_milli=0, num_gpu=1, gpu_milli=1000, gpu_models=frozenset(), weight=0.5),
        TypicalPod(cpu_milli=0, num_gpu=1, gpu_milli=500, gpu_models=frozenset(), weight=0.5),
    ]
    return FragmentationScore(typical, ["A100-80GB"])


def test_fragmentation_score_prefers_filling_a_half_used_gpu_to_breaking_a_whole_one() -> None:
    cache = SchedulerCache.rebuild([make_node("half").gpus(2).build(), make_node("whole").gpus(2).build()])
    occupy(cache, "half", {0: 500})
    plugin = fgd_plugin()
    pod = make_pod("p", gpus=1, milli=500)
    state = CycleState()
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    framework.schedule_pod(state, pod, cache.snapshot())
    snapshot = cache.snapshot()
    filling, breaking = (
        plugin.score(state, pod, snapshot.node("half")),
        plugin.score(state, pod, snapshot.node("whole")),
    )
    assert filling > 50 > breaking
    assert plugin.score(state, make_pod("cpu-only", gpus=0), snapshot.node("whole")) == 50


def test_fragmentation_weight_can_overrule_node_spread() -> None:
    cache = SchedulerCache.rebuild([make_node("half").gpus(2).build(), make_node("whole").gpus(2).build()])
    occupy(cache, "half", {0: 500})
    pod = make_pod("p", gpus=1, milli=500, node_policy=Policy.SPREAD)
    plain = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    assert plain.schedule_pod(CycleState(), pod, cache.snapshot()).node == "whole"
    with_fgd = Framework(
        build_profile(
            cache,
            GangRegistry(),
            RecordingBinder(),
            {"weights": {"Fragmentation": 5}},
            gangs=False,
            fragmentation=fgd_plugin(),
        )
    )
    assert with_fgd.schedule_pod(CycleState(), pod, cache.snapshot()).node == "half"


def test_a_mig_profile_no_gpu_model_of_the_cluster_offers_is_explained_once() -> None:
    cache = SchedulerCache.rebuild(
        [make_node("a100").gpus(2).build(), make_node("t4").gpus(2, model="T4").build()]
    )
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    h100_only = PodSpec.from_resources("p1", "g", {"nvidia.com/mig-1g.10gb+me": 1})  # A100 has 1g.10gb+me
    first = framework.schedule_pod(CycleState(), h100_only, cache.snapshot()).diagnosis
    assert first is not None and "offered by no GPU model" not in first.message()
    never = PodSpec.from_resources("p2", "g", {"nvidia.com/mig-1g.18gb": 1})  # H200's smallest profile
    result = framework.schedule_pod(CycleState(), never, cache.snapshot())
    assert result.node is None and result.diagnosis is not None
    assert result.diagnosis.message() == (
        "MIG profile 1g.18gb is offered by no GPU model in the cluster (A100-80GB, T4)"
    )
    # a profile an A100 can be partitioned into is not ruled out: slicing may make it
    possible = PodSpec.from_resources("p3", "g", {"nvidia.com/mig-3g.40gb": 1})
    message = framework.schedule_pod(CycleState(), possible, cache.snapshot()).diagnosis.message()  # type: ignore[union-attr]
    assert "offered by no GPU model" not in message and "3g.40gb" in message


def test_a_node_of_an_unknown_model_keeps_any_profile_possible() -> None:
    cache = SchedulerCache.rebuild([make_node("odd").gpus(1, model="MysteryGPU").build()])
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    pod = PodSpec.from_resources("p", "g", {"nvidia.com/mig-1g.18gb": 1})
    message = framework.schedule_pod(CycleState(), pod, cache.snapshot()).diagnosis.message()  # type: ignore[union-attr]
    assert "offered by no GPU model" not in message


def test_a_node_selector_sends_the_pod_to_a_node_with_every_label() -> None:
    spot = make_node("spot").gpus(4).label("karpenter.sh/capacity-type", "spot").build()
    on_demand = make_node("on-demand").gpus(4).label("karpenter.sh/capacity-type", "on-demand").build()
    cache = SchedulerCache.rebuild([on_demand, spot])
    pod = replace(make_pod("p", gpus=1), node_selector=(("karpenter.sh/capacity-type", "spot"),))
    assert place(cache, pod)[0] == "spot"
    nowhere = replace(make_pod("q", gpus=1), node_selector=(("karpenter.sh/capacity-type", "reserved"),))
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    result = framework.schedule_pod(CycleState(), nowhere, cache.snapshot())
    assert result.node is None and result.diagnosis is not None
    assert result.diagnosis.message() == "node didn't match the pod's node selector on 2 nodes"


def test_a_noschedule_taint_keeps_pods_that_do_not_tolerate_it_away() -> None:
    tainted = replace(
        make_node("gpu-tainted").gpus(8).build(), taints=(Taint("nvidia.com/gpu", TaintEffect.NO_SCHEDULE),)
    )
    cache = SchedulerCache.rebuild([tainted, make_node("plain").gpus(2).build()])
    assert place(cache, make_pod("p", gpus=4))[0] is None  # only the tainted node has 4 free GPUs
    tolerant = replace(
        make_pod("q", gpus=4),
        tolerations=(
            Toleration("nvidia.com/gpu", TolerationOperator.EXISTS, effect=TaintEffect.NO_SCHEDULE),
        ),
    )
    assert place(cache, tolerant)[0] == "gpu-tainted"
