"""Packing time-sliced GPUs by measured use: each pod's history (bounded minutes, cold minutes filled
with its peak, too little history means none), and the planner growing a time-sliced node's replicas
for pending shares where its running pods measure light, never by taking a replica away, and by
requested milli where nothing is measured."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tessera.cluster.catalogue import model
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.domain.gpu import Gpu
from tessera.cluster.domain.node import Node
from tessera.cluster.domain.requirements import GpuRequest, GpuRequestKind, Pod, PodRequirements
from tessera.slicing.domain.cluster_plan import GpuState, NodeState, PlannerSettings, plan_cluster
from tessera.slicing.domain.demand import PodShape
from tessera.slicing.domain.layout import GpuChange, GpuLayout, LayoutPlan, SharingMode
from tessera.slicing.domain.operation import ChangeKind
from tessera.slicing.domain.time_slicing import PodUse, fit_by_usage
from tessera.slicing.domain.usage_history import MinuteUse, UsageHistory, UsageSettings
from tessera.slicing.service_layer.cluster_view import (
    grows_replicas,
    node_changes,
    node_state,
)

A100 = model("A100-80GB")
NOW = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)
SHORT = UsageSettings(
    lookback_minutes=30, half_life_minutes=10.0, overload_budget=0.01, min_history_minutes=5
)


# history ------------------------------------------------------------------------------------------


def test_a_pod_with_too_few_minutes_has_no_history() -> None:
    history = UsageHistory(SHORT)
    for minute in range(96, 100):
        history.add("ns/a", minute, 5.0)
    assert history.series("ns/a", 100) is None
    history.add("ns/a", 95, 5.0)
    series = history.series("ns/a", 100)
    assert series is not None and len(series) == 30


def test_minutes_are_the_mean_of_their_readings_and_cold_minutes_count_as_the_peak() -> None:
    history = UsageHistory.of(
        [MinuteUse("ns/a", m, 30.0, 3) for m in range(90, 99)] + [MinuteUse("ns/a", 99, 80.0, 2)], SHORT
    )
    series = history.series("ns/a", 100)
    assert series is not None
    assert series[-1] == 40.0  # 80 over two readings
    assert series[-2] == 10.0
    assert series[0] == 40.0  # before the pod's first reading: its peak, not zero


def test_the_history_is_bounded_to_the_window() -> None:
    history = UsageHistory(SHORT)
    for minute in range(0, 200):
        history.add("ns/a", minute, 10.0)
    history.add("ns/gone", 5, 10.0)
    history.prune(200)
    assert history.minutes_of("ns/a") == 30
    assert history.pods == ["ns/a"]  # a pod with nothing left in the window is forgotten
    series = history.series("ns/a", 200)
    assert series is not None and len(series) == SHORT.lookback_minutes


def test_settings_refuse_what_cannot_be_used() -> None:
    with pytest.raises(ValueError, match="min_history_minutes"):
        UsageSettings(lookback_minutes=5, min_history_minutes=6)
    with pytest.raises(ValueError, match="samples"):
        UsageHistory().add("ns/a", 1, 10.0, samples=0)


# fit ----------------------------------------------------------------------------------------------


def _light(pod: str, pct: float = 5.0, minutes: int = 30) -> PodUse:
    return PodUse(pod, 400, (pct,) * minutes)


def test_light_pods_take_more_pending_shares_than_their_milli_would() -> None:
    fit = fit_by_usage([[_light("a"), _light("b")]], [400, 400, 400], 16, 0.01, 10.0)
    # measured: 5 + 5 + 40 + 40 = 90 % fits, a third 40 % does not
    assert fit.placed == (400, 400) and fit.replicas == 4 and fit.measured == 2
    by_milli = fit_by_usage([[PodUse("a", 400), PodUse("b", 400)]], [400, 400, 400], 16, 0.01, 10.0)
    assert by_milli.placed == () and by_milli.replicas == 2 and by_milli.measured == 0


def test_pods_whose_busy_minutes_meet_keep_pending_shares_off() -> None:
    busy = tuple([90.0] * 10 + [5.0] * 20)
    fit = fit_by_usage([[PodUse("a", 100, busy)]], [100], 16, 0.01, None)
    assert fit.placed == (100,)  # 90 + 10 reaches 100 % and no more
    fit = fit_by_usage([[PodUse("a", 100, busy)]], [200], 16, 0.01, None)
    assert fit.placed == () and fit.replicas == 1  # 110 % in a third of the minutes


def test_a_node_with_a_hot_gpu_gets_the_hot_gpus_bound() -> None:
    hot = [PodUse("h1", 400, (55.0,) * 30), PodUse("h2", 400, (35.0,) * 30)]
    idle: list[PodUse] = []
    fit = fit_by_usage([hot, idle], [100] * 8, 16, 0.01, 10.0)
    # the hot GPU takes one 10 % share (55 + 35 + 10 reaches 100, two pass it); replicas are node-wide, so the
    # idle GPU, which alone would take ten, gets three as well
    assert fit.replicas == 3
    assert fit.placed == (100, 100, 100, 100)  # one beside the hot pods, three on the idle GPU


def test_replicas_never_drop_below_what_running_pods_hold() -> None:
    crowded = [PodUse(f"c{i}", 100, (30.0,) * 30) for i in range(4)]  # 120 %: over already
    fit = fit_by_usage([crowded, [_light("a")]], [100, 100], 16, 0.01, 10.0)
    assert fit.replicas == 4  # the crowded GPU's four pods keep their slices
    assert fit.placed == (100, 100)  # the light GPU fills up to four


# the planner --------------------------------------------------------------------------------------


def _time_sliced(
    pods: tuple[PodUse, ...], replicas: int = 2, changed_s_ago: float | None = None
) -> NodeState:
    gpu = GpuState(
        0,
        A100,
        GpuLayout.time_slicing(replicas),
        running_pods=len(pods),
        used_milli=sum(p.milli for p in pods),
        pods=pods,
        changed_s_ago=changed_s_ago,
    )
    return NodeState("ts", (gpu,))


SETTINGS = PlannerSettings(min_dwell_s=600, usage=SHORT)


def test_the_planner_grows_replicas_by_measured_use_and_says_so() -> None:
    plan = plan_cluster([_time_sliced((_light("a"), _light("b")))], {PodShape.share(400): 2}, SETTINGS)
    (change,) = plan.changes
    assert change.current == GpuLayout.time_slicing(2)
    assert change.desired == GpuLayout.time_slicing(4)
    assert "by measured use" in change.reason and "2 -> 4" in change.reason
    assert plan.score.pods_placeable == 2


def test_without_history_the_requested_milli_decide_and_nothing_is_taken() -> None:
    unmeasured = (PodUse("a", 400), PodUse("b", 400))
    plan = plan_cluster([_time_sliced(unmeasured)], {PodShape.share(400): 2}, SETTINGS)
    assert plan.changes == ()  # a busy time-sliced node is not changed by milli
    assert any("fractional demand" in e for e in plan.explanations)


def test_without_history_small_shares_still_grow_replicas_by_their_milli() -> None:
    small = (PodUse("a", 100), PodUse("b", 100))
    plan = plan_cluster([_time_sliced(small)], {PodShape.share(100): 2}, SETTINGS)
    (change,) = plan.changes
    assert change.desired == GpuLayout.time_slicing(4)
    assert "by requested milli (no pod has history)" in change.reason


def test_growth_respects_the_dwell_time_and_never_shrinks() -> None:
    recent = _time_sliced((_light("a"), _light("b")), changed_s_ago=60)
    assert plan_cluster([recent], {PodShape.share(400): 2}, SETTINGS).changes == ()
    wide = _time_sliced((_light("a"), _light("b")), replicas=8)  # replicas enough already
    assert plan_cluster([wide], {PodShape.share(400): 2}, SETTINGS).changes == ()


def test_idle_exclusive_nodes_are_still_shared_by_requested_milli() -> None:
    idle = NodeState("idle", (GpuState(0, A100, GpuLayout.exclusive()),))
    plan = plan_cluster([idle], {PodShape.share(250): 4}, SETTINGS)
    (change,) = plan.changes
    assert change.desired.replicas == 4 and "by requested milli" in change.reason


# into a node change -------------------------------------------------------------------------------


def _pod(name: str, milli: int) -> Pod:
    request = GpuRequest(GpuRequestKind.FRACTIONAL, count=1, milli=milli)
    return Pod(
        "ns",
        name,
        PodRequirements(gpu=request),
        node_name="ts",
        assignment=DeviceAssignment("ts", (GpuShare("GPU-0", milli),)),
    )


def _node(replicas: int) -> Node:
    gpus = (Gpu(0, "GPU-0", "A100-80GB", 81920),)
    return Node(
        "ts", 64_000, 512_000, gpus, gpu_replicas=replicas, extended_allocatable={"nvidia.com/gpu": replicas}
    )


def test_the_view_gives_each_pod_its_milli_and_history() -> None:
    histories = {"ns/a": (5.0,) * 30}
    state = node_state(_node(2), [_pod("a", 400), _pod("b", 300)], {}, NOW, histories.get)
    assert state is not None
    (gpu,) = state.gpus
    assert gpu.pods == (PodUse("ns/a", 400, (5.0,) * 30), PodUse("ns/b", 300, None))


def test_growing_replicas_on_busy_gpus_neither_drains_nor_waits_for_the_pods() -> None:
    change = GpuChange("ts", 0, "A100-80GB", GpuLayout.time_slicing(2), GpuLayout.time_slicing(4), "use")
    assert grows_replicas([change])
    [node_change] = node_changes(LayoutPlan((change,)), {"ts": _node(2)}, {"ts": frozenset({0})})
    assert node_change.drain is False and node_change.kind is ChangeKind.TIME_SLICING
    back = GpuChange("ts", 0, "A100-80GB", GpuLayout.time_slicing(4), GpuLayout.exclusive(), "whole")
    assert not grows_replicas([back])
    assert SharingMode.TIME_SLICING is change.desired.mode
