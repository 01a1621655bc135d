"""The cluster planner: held slices are never taken, idle GPUs go first, changes must pay, no flapping."""

from __future__ import annotations

import math
import random
from dataclasses import replace

from tessera.cluster.catalogue import GpuModel, model
from tessera.slicing.domain.cluster_plan import GpuState, NodeState, PlannerSettings, plan_cluster
from tessera.slicing.domain.demand import PodShape
from tessera.slicing.domain.layout import (
    GpuLayout,
    MigSlice,
    SharingMode,
    device_plugin_config,
    mig_parted_config,
)

A100 = model("A100-80GB")
T4 = model("T4")
EXCLUSIVE = GpuLayout.exclusive()


def _gpu(
    index: int,
    layout: GpuLayout = EXCLUSIVE,
    gpu_model: GpuModel = A100,
    *,
    held: frozenset[MigSlice] = frozenset(),
    running_pods: int = 0,
    used_milli: int = 0,
    changed_s_ago: float | None = None,
) -> GpuState:
    return GpuState(
        index,
        gpu_model,
        layout,
        held=held,
        running_pods=running_pods,
        used_milli=used_milli,
        changed_s_ago=changed_s_ago,
    )


def _node(name: str, *gpus: GpuState, pinned: bool = False) -> NodeState:
    return NodeState(name, tuple(gpus), pinned=pinned)


def test_a_pending_mig_pod_takes_an_idle_gpu_and_leaves_the_busy_one() -> None:
    nodes = [_node("a", _gpu(0, running_pods=1), _gpu(1))]
    plan = plan_cluster(nodes, {PodShape.mig("3g.40gb"): 1})
    (change,) = plan.changes
    assert (change.node, change.gpu_index) == ("a", 1)
    assert change.desired.mode is SharingMode.MIG
    assert change.desired.mig_profile_counts() == {"3g.40gb": 1}
    assert "3g.40gb" in change.reason
    assert plan.score.pods_placeable == 1 and plan.score.pods_disturbed == 0
    # what part of the operator applies renders cleanly
    layouts = {0: EXCLUSIVE, **plan.desired_layouts("a")}
    assert mig_parted_config(layouts)["version"] == "v1"


def test_a_busy_gpu_is_left_alone_when_no_idle_one_exists() -> None:
    nodes = [_node("a", _gpu(0, running_pods=1))]
    plan = plan_cluster(nodes, {PodShape.mig("3g.40gb"): 1})
    assert plan.is_empty
    assert any("no idle GPU" in e for e in plan.explanations)


def test_held_slices_are_never_taken_even_when_busy_gpus_may_change() -> None:
    current = GpuLayout.mig_geometry([("3g.40gb", 0), ("3g.40gb", 4)])
    held = frozenset({MigSlice(0, "3g.40gb")})
    nodes = [_node("a", _gpu(0, current, held=held))]
    settings = PlannerSettings(change_busy_gpus=True)
    rng = random.Random(3)
    profiles = ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    for _ in range(40):
        demand = {PodShape.mig(rng.choice(profiles)): rng.randint(1, 4) for _ in range(3)}
        plan = plan_cluster(nodes, demand, settings)
        for change in plan.changes:
            assert held <= set(change.desired.mig)
            change.desired.validate_for(A100)


def test_free_instances_serve_before_any_change() -> None:
    current = GpuLayout.mig_geometry([("3g.40gb", 0), ("3g.40gb", 4)])
    nodes = [_node("a", _gpu(0, current, held=frozenset({MigSlice(0, "3g.40gb")})), _gpu(1))]
    assert plan_cluster(nodes, {PodShape.mig("3g.40gb"): 1}).is_empty


def test_a_profile_no_model_supports_is_explained_not_planned() -> None:
    nodes = [_node("a", _gpu(0), _gpu(1, gpu_model=T4))]
    plan = plan_cluster(nodes, {PodShape.mig("1g.5gb"): 2})
    assert plan.is_empty
    (explanation,) = plan.explanations
    assert "1g.5gb" in explanation and "A100-80GB" in explanation and "T4" in explanation
    # a second round with the same demand gives the same answer: no loop of changes
    assert plan_cluster(nodes, {PodShape.mig("1g.5gb"): 2}) == plan


def test_pinned_nodes_and_recently_changed_gpus_are_not_planned() -> None:
    demand = {PodShape.mig("1g.10gb"): 3}
    assert plan_cluster([_node("a", _gpu(0), pinned=True)], demand).is_empty
    fresh = [_node("a", _gpu(0, changed_s_ago=30.0))]
    assert plan_cluster(fresh, demand).is_empty
    settled = [_node("a", _gpu(0, changed_s_ago=3600.0))]
    assert not plan_cluster(settled, demand).is_empty


def test_a_change_must_pay_for_its_reconfiguration() -> None:
    nodes = [_node("a", _gpu(0))]
    demand = {PodShape.mig("1g.10gb"): 1}  # 1/7 of a GPU for the horizon
    assert not plan_cluster(nodes, demand).is_empty
    stingy = PlannerSettings(benefit_horizon_minutes=10.0, reconfigure_minutes=5.0)
    assert plan_cluster(nodes, demand, stingy).is_empty


def test_layouts_do_not_flap_when_demand_comes_and_goes() -> None:
    """Demand for MIG, then none, then whole GPUs within the dwell time: one change, then none."""
    gpu = _gpu(0)
    plan = plan_cluster([_node("a", gpu)], {PodShape.mig("2g.20gb"): 2})
    (change,) = plan.changes
    mig = GpuState(0, A100, change.desired, changed_s_ago=60.0)
    assert plan_cluster([_node("a", mig)], {}).is_empty  # no demand: nothing is undone
    assert plan_cluster([_node("a", mig)], {PodShape.mig("2g.20gb"): 1}).is_empty  # served by free slices
    assert plan_cluster([_node("a", mig)], {PodShape.whole(): 1}).is_empty  # within the dwell time
    later = GpuState(0, A100, change.desired, changed_s_ago=3600.0)
    back = plan_cluster([_node("a", later)], {PodShape.whole(): 1})
    (undo,) = back.changes
    assert undo.desired == EXCLUSIVE and "whole-GPU" in undo.reason


def test_whole_gpu_pods_use_free_exclusive_gpus_first() -> None:
    mig = GpuLayout.mig_geometry([("7g.80gb", 0)])
    nodes = [_node("a", _gpu(0), _gpu(1, mig))]
    assert plan_cluster(nodes, {PodShape.whole(): 1}).is_empty
    (change,) = plan_cluster(nodes, {PodShape.whole(): 2}).changes
    assert change.gpu_index == 1 and change.desired == EXCLUSIVE


def test_fractional_demand_time_slices_a_whole_idle_node() -> None:
    nodes = [_node("big", *(_gpu(i) for i in range(8))), _node("small", _gpu(0), _gpu(1))]
    # 1800 milli on two GPUs as 600 + 300 each: a 600 share does not fit half a GPU, so no MPS
    plan = plan_cluster(nodes, {PodShape.share(600): 2, PodShape.share(300): 2})
    assert plan.nodes == ("small",)
    layouts = plan.desired_layouts("small")
    assert {layout.mode for layout in layouts.values()} == {SharingMode.TIME_SLICING}
    replicas = layouts[0].replicas
    assert replicas >= math.ceil(4 / 2)
    assert device_plugin_config(layouts)["sharing"]["timeSlicing"]["resources"][0]["replicas"] == replicas
    assert plan.score.pods_placeable == 4 and plan.score.gpus_freed == 2.0


def test_shares_that_fit_equal_parts_of_a_gpu_get_mps_where_the_model_and_node_allow() -> None:
    nodes = [_node("big", *(_gpu(i) for i in range(8))), _node("small", _gpu(0), _gpu(1))]
    plan = plan_cluster(nodes, {PodShape.share(300): 5})  # 1500 milli: two GPUs, 3 pods at most on one
    assert plan.nodes == ("small",)
    layouts = plan.desired_layouts("small")
    assert set(layouts.values()) == {GpuLayout.mps(3)}  # each client gets 333 milli of memory and SMs
    assert device_plugin_config(layouts)["sharing"]["mps"]["resources"][0]["replicas"] == 3
    assert plan.score.pods_placeable == 5 and plan.score.gpus_freed == 3.0
    # the same demand is time-sliced when MPS is not wanted, on a pre-Volta model, or beside MIG
    off = plan_cluster(nodes, {PodShape.share(300): 5}, PlannerSettings(prefer_mps=False))
    assert {c.desired.mode for c in off.changes} == {SharingMode.TIME_SLICING}
    pascal = [_node("p", _gpu(0, gpu_model=model("P100")), _gpu(1, gpu_model=model("P100")))]
    assert {c.desired.mode for c in plan_cluster(pascal, {PodShape.share(300): 5}).changes} == {
        SharingMode.TIME_SLICING
    }
    beside_mig = [_node("m", _gpu(0), _gpu(1), _gpu(2, GpuLayout.mig_geometry([("7g.80gb", 0)])))]
    changes = plan_cluster(beside_mig, {PodShape.share(300): 5}).changes
    assert changes and {c.desired.mode for c in changes} == {SharingMode.TIME_SLICING}


def test_free_mps_replicas_take_only_shares_that_fit_a_client() -> None:
    mps = GpuLayout.mps(4)  # 250 milli a client
    nodes = [_node("shared", _gpu(0, mps, running_pods=1, used_milli=250), _gpu(1, mps))]
    assert plan_cluster(nodes, {PodShape.share(250): 7}).is_empty  # 7 free replicas take them
    plan = plan_cluster(nodes, {PodShape.share(300): 1})  # too big for a client: not served there
    assert plan.is_empty and any("fractional demand" in e for e in plan.explanations)


def test_fractional_demand_fits_free_replicas_first_and_skips_busy_nodes() -> None:
    sliced = GpuLayout.time_slicing(4)
    nodes = [
        _node("shared", _gpu(0, sliced, running_pods=2, used_milli=400), _gpu(1, sliced)),
        _node("busy", _gpu(0, running_pods=1), _gpu(1)),
    ]
    assert plan_cluster(nodes, {PodShape.share(250): 6}).is_empty
    plan = plan_cluster(nodes, {PodShape.share(250): 7})
    assert plan.is_empty and any("fractional demand" in e for e in plan.explanations)


def test_free_replicas_slicing_chose_take_shares_past_1000_milli_as_the_scheduler_places_them() -> None:
    sliced = GpuLayout.time_slicing(4)
    gpu = _gpu(0, sliced, running_pods=2, used_milli=1200)
    by_replicas = [replace(_node("shared", gpu), shares_by_replicas=True)]
    served = plan_cluster(by_replicas, {PodShape.share(600): 2})  # the two free replicas take them
    assert served.is_empty and served.explanations == ()
    plan = plan_cluster(by_replicas, {PodShape.share(600): 3})
    assert plan.is_empty and any("fractional demand" in e for e in plan.explanations), "2 replicas, not 3"
    by_hand = [_node("shared", gpu)]  # time-slicing set by hand: the scheduler still counts milli
    plan = plan_cluster(by_hand, {PodShape.share(600): 1})
    assert plan.is_empty and any("fractional demand" in e for e in plan.explanations)


def test_the_mig_plan_packs_near_the_lower_bound() -> None:
    rng = random.Random(5)
    nodes = [_node(f"n{i}", *(_gpu(j) for j in range(8))) for i in range(6)]
    sizes = {"1g.10gb": (1, 1), "2g.20gb": (2, 2), "3g.40gb": (3, 4), "4g.40gb": (4, 4), "7g.80gb": (7, 8)}
    demand: dict[PodShape, int] = {}
    for _ in range(40):
        shape = PodShape.mig(rng.choice(list(sizes)))
        demand[shape] = demand.get(shape, 0) + 1
    plan = plan_cluster(nodes, demand)
    served = sum(c.score.pods_placeable for c in plan.changes)
    assert served == sum(demand.values())
    compute = sum(sizes[s.mig_profile][0] * n for s, n in demand.items() if s.mig_profile)
    memory = sum(sizes[s.mig_profile][1] * n for s, n in demand.items() if s.mig_profile)
    lower_bound = max(math.ceil(compute / 7), math.ceil(memory / 8))
    assert len(plan.changes) <= math.ceil(1.10 * lower_bound)


def test_free_gpus_promised_to_whole_gpu_pods_are_not_time_sliced() -> None:
    nodes = [_node("a", _gpu(0), _gpu(1)), _node("b", _gpu(0), _gpu(1))]
    # the two whole-GPU pods fill node a (best fit), so the shares go to node b
    plan = plan_cluster(nodes, {PodShape.whole(): 2, PodShape.share(400): 2})
    assert plan.nodes == ("b",)
    assert {c.desired.mode for c in plan.changes} == {SharingMode.MPS}  # two 400s: 500 milli a client
    both = plan_cluster(nodes, {PodShape.whole(): 3, PodShape.share(400): 2})
    assert both.is_empty and any("fractional demand" in e for e in both.explanations)


def test_a_mig_pod_that_allows_only_some_models_gets_one_of_them() -> None:
    h100 = model("H100-80GB")
    nodes = [_node("a", _gpu(0)), _node("z", _gpu(0, gpu_model=h100))]
    unconstrained = plan_cluster(nodes, {PodShape.mig("3g.40gb"): 1})
    (change,) = unconstrained.changes
    constrained = plan_cluster(nodes, {PodShape(mig_profile="3g.40gb", models=("H100-80GB",)): 1})
    (only,) = constrained.changes
    assert (only.node, only.model) == ("z", "H100-80GB")
    a100_only = plan_cluster(nodes, {PodShape(mig_profile="3g.40gb", models=("A100-80GB",)): 1})
    assert [(c.node, c.model) for c in a100_only.changes] == [("a", "A100-80GB")]
    nowhere = plan_cluster(nodes, {PodShape(mig_profile="3g.40gb", models=("T4",)): 2})
    assert nowhere.is_empty
    (explanation,) = nowhere.explanations
    assert "3g.40gb" in explanation and "allows (T4)" in explanation and "H100-80GB" in explanation
    assert change.desired.mig_profile_counts() == {"3g.40gb": 1}


def test_mig_is_not_planned_beside_mps_on_one_node() -> None:
    mps_node = _node("a", _gpu(0, GpuLayout.mps(2)), _gpu(1))
    plan = plan_cluster([mps_node], {PodShape.mig("1g.10gb"): 2})
    assert plan.is_empty
    plan = plan_cluster([mps_node, _node("b", _gpu(0))], {PodShape.mig("1g.10gb"): 2})
    assert plan.nodes == ("b",)
    device_plugin_config(plan.desired_layouts("b"))  # renders: no MPS beside the MIG GPU
