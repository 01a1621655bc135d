"""Layout value types and the mig-parted / device-plugin configs rendered from them."""

from __future__ import annotations

import pytest

from tessera.cluster.catalogue import model
from tessera.slicing.domain.layout import (
    GpuChange,
    GpuLayout,
    InvalidLayout,
    LayoutPlan,
    MigSlice,
    PlanScore,
    SharingMode,
    device_plugin_config,
    mig_config_name,
    mig_parted_config,
    node_capacity,
)

A100 = model("A100-80GB")


def test_layouts_round_trip_through_their_text() -> None:
    layouts = [
        GpuLayout.exclusive(),
        GpuLayout.mig_geometry([("3g.40gb", 4), ("1g.10gb", 0), ("2g.20gb", 2)]),
        GpuLayout.mig_geometry([]),
        GpuLayout.time_slicing(4),
        GpuLayout.mps(3),
    ]
    for layout in layouts:
        assert GpuLayout.parse(layout.describe()) == layout
    assert layouts[1].describe() == "mig:1g.10gb@0,2g.20gb@2,3g.40gb@4"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("striped", "mode must be one of"),
        ("time-slicing", "needs a replica count"),
        ("time-slicing:1", "needs at least 2"),
        ("mig:1g.10gb", "<profile>@<start>"),
        ("exclusive:2", "takes no arguments"),
    ],
)
def test_bad_layout_text_names_the_reason(text: str, fragment: str) -> None:
    with pytest.raises(InvalidLayout, match=fragment):
        GpuLayout.parse(text)


def test_validate_for_checks_the_model_geometry_and_mps_support() -> None:
    GpuLayout.mig_geometry([("3g.40gb", 0), ("3g.40gb", 4)]).validate_for(A100)
    with pytest.raises(InvalidLayout, match="memory slice 4 is already taken"):
        GpuLayout.mig_geometry([("4g.40gb", 0), ("3g.40gb", 4), ("1g.10gb", 4)]).validate_for(A100)
    with pytest.raises(InvalidLayout, match="does not support MIG"):
        GpuLayout.mig_geometry([("1g.10gb", 0)]).validate_for(model("T4"))
    with pytest.raises(InvalidLayout, match="MPS needs Volta"):
        GpuLayout.mps(2).validate_for(model("P100"))
    GpuLayout.mps(2).validate_for(model("T4"))


def test_mig_parted_config_groups_devices_with_one_layout() -> None:
    mixed = GpuLayout.mig_geometry([("1g.10gb", 0), ("1g.10gb", 1), ("3g.40gb", 4)])
    layouts = {0: mixed, 1: GpuLayout.exclusive(), 2: mixed, 3: GpuLayout.mig_geometry([("7g.80gb", 0)])}
    document = mig_parted_config(layouts)
    (name,) = document["mig-configs"]
    assert name == mig_config_name(layouts)
    assert len(name) <= 63
    assert document["mig-configs"][name] == [
        {"devices": [0, 2], "mig-enabled": True, "mig-devices": {"1g.10gb": 2, "3g.40gb": 1}},
        {"devices": [1], "mig-enabled": False},
        {"devices": [3], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}},
    ]
    assert mig_config_name({0: GpuLayout.exclusive()}) != mig_config_name({0: GpuLayout.time_slicing(2)})


def test_device_plugin_config_shares_whole_gpus_alike() -> None:
    mig = GpuLayout.mig_geometry([("7g.80gb", 0)])
    assert device_plugin_config({0: GpuLayout.exclusive(), 1: mig}) == {"version": "v1"}
    sliced = device_plugin_config({0: GpuLayout.time_slicing(4), 1: GpuLayout.time_slicing(4), 2: mig})
    assert sliced["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
    mps = device_plugin_config({0: GpuLayout.mps(3)})
    assert mps["sharing"]["mps"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 3}]
    with pytest.raises(InvalidLayout, match="shared alike"):
        device_plugin_config({0: GpuLayout.time_slicing(4), 1: GpuLayout.exclusive()})
    with pytest.raises(InvalidLayout, match="MPS cannot be combined with MIG"):
        device_plugin_config({0: GpuLayout.mps(2), 1: mig})


def test_capacity_and_plan_views() -> None:
    mig = GpuLayout.mig_geometry([("1g.10gb+me", 0), ("3g.40gb", 4)])
    assert node_capacity({0: mig, 1: GpuLayout.time_slicing(3)}) == {
        "nvidia.com/gpu": 3,
        "nvidia.com/mig-1g.10gb.me": 1,
        "nvidia.com/mig-3g.40gb": 1,
    }
    keep = GpuChange("n1", 1, "A100-80GB", GpuLayout.exclusive(), GpuLayout.exclusive(), "no demand")
    move = GpuChange("n1", 0, "A100-80GB", GpuLayout.exclusive(), mig, "pending 3g.40gb", PlanScore(1))
    plan = LayoutPlan((keep, move), score=move.score)
    assert plan.nodes == ("n1",)
    assert [c.gpu_index for c in plan.for_node("n1")] == [0, 1]
    assert plan.desired_layouts("n1")[0].mode is SharingMode.MIG
    assert not plan.is_empty and LayoutPlan((keep,)).is_empty
    assert PlanScore(1, 0.5, 0, 2.0) + PlanScore(2, 0.5, 0, 1.0) == PlanScore(3, 1.0, 0, 3.0)


def test_slices_must_be_well_formed() -> None:
    with pytest.raises(InvalidLayout, match="start must be >= 0"):
        MigSlice(start=-1, profile="1g.10gb")
    with pytest.raises(InvalidLayout, match="only a MIG layout has slices"):
        GpuLayout(SharingMode.EXCLUSIVE, mig=(MigSlice(0, "1g.10gb"),))
