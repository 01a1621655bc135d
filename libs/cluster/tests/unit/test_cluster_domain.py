"""Domain value objects: validation with field names, and the small helpers the scheduler uses."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tessera.cluster.conventions.quantity import count, cpu_milli, memory_mib, parse_quantity
from tessera.cluster.domain import (
    DeviceAssignment,
    Gpu,
    GpuHealth,
    GpuRequest,
    GpuRequestKind,
    GpuShare,
    MigSlice,
    Node,
    PodGroup,
    PodRef,
    Taint,
    TaintEffect,
    Toleration,
    TolerationOperator,
)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"kind": GpuRequestKind.WHOLE, "count": 0, "milli": 1000}, "whole GPUs"),
        ({"kind": GpuRequestKind.FRACTIONAL, "count": 1, "milli": 1000}, "fractional"),
        ({"kind": GpuRequestKind.MIG, "count": 1}, "MIG slices"),
        ({"kind": GpuRequestKind.NONE, "count": 1}, "none"),
    ],
)
def test_gpu_requests_must_be_consistent(kwargs: dict[str, object], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        GpuRequest(**kwargs)  # type: ignore[arg-type]


def test_gpu_request_helpers() -> None:
    assert GpuRequest.whole(4).total_milli == 4000
    assert GpuRequest.fraction(250).total_milli == 250
    assert GpuRequest.mig("1g.10gb", 2).total_milli == 0
    constrained = GpuRequest.whole(1, frozenset({"A100-80GB"}))
    assert constrained.allows_model("A100-80GB") and not constrained.allows_model("T4")
    assert GpuRequest.whole(1).allows_model("anything")


def test_share_and_assignment_validation() -> None:
    with pytest.raises(ValueError, match=r"milli: must be in 1\.\.1000"):
        GpuShare("GPU-a", 0)
    with pytest.raises(ValueError, match="MIG slice is held whole"):
        GpuShare("GPU-a", 500, MigSlice("1g.10gb", 0))
    two_slices = DeviceAssignment(
        "n", (GpuShare("GPU-a", mig=MigSlice("1g.10gb", 0)), GpuShare("GPU-a", mig=MigSlice("1g.10gb", 1)))
    )
    assert two_slices.gpu_uuids == ("GPU-a", "GPU-a")
    assert DeviceAssignment("n", (GpuShare("GPU-a", 300), GpuShare("GPU-b"))).total_milli == 1300


def test_tolerations_follow_kubernetes_matching() -> None:
    taint = Taint("nvidia.com/gpu", TaintEffect.NO_SCHEDULE, "present")
    assert Toleration(operator=TolerationOperator.EXISTS).tolerates(taint)
    assert Toleration("nvidia.com/gpu", TolerationOperator.EQUAL, "present").tolerates(taint)
    assert not Toleration("nvidia.com/gpu", TolerationOperator.EQUAL, "absent").tolerates(taint)
    assert not Toleration(
        "nvidia.com/gpu", TolerationOperator.EXISTS, effect=TaintEffect.NO_EXECUTE
    ).tolerates(taint)
    assert not Toleration().tolerates(taint)
    soft = Node("n", 1, 1, taints=(Taint("x", TaintEffect.PREFER_NO_SCHEDULE),))
    assert soft.tolerated_by(())


def test_node_lookups_and_frozen_labels() -> None:
    node = Node(
        "n",
        1000,
        1024,
        gpus=(Gpu(0, "GPU-a", "T4", 16384), Gpu(1, "GPU-b", "T4", 16384, health=GpuHealth.UNHEALTHY)),
        labels={"pool": "x"},
    )
    assert node.gpu_by_uuid("GPU-b") is node.gpus[1]
    assert node.gpu_by_index(0) is node.gpus[0]
    assert node.healthy_gpus == (node.gpus[0],)
    assert node.matches_selector({"pool": "x"}) and not node.matches_selector({"pool": "y"})
    with pytest.raises(TypeError):
        node.labels["pool"] = "y"  # type: ignore[index]


def test_refs_and_groups() -> None:
    assert PodRef.parse("ns/p") == PodRef("ns", "p")
    assert str(PodRef("ns", "p")) == "ns/p"
    with pytest.raises(ValueError, match="namespace/name"):
        PodRef.parse("p")
    with pytest.raises(ValueError, match="minMember"):
        PodGroup("ns", "g", 0)


@pytest.mark.parametrize(
    ("text", "milli"), [("500m", 500), ("2", 2000), ("1.5", 1500), ("0.1", 100), (4, 4000), ("1k", 1_000_000)]
)
def test_cpu_quantities(text: str | int, milli: int) -> None:
    assert cpu_milli(text) == milli


@pytest.mark.parametrize(
    ("text", "mib"),
    [("1Gi", 1024), ("512Mi", 512), ("1G", 954), ("1e9", 954), ("1048576", 1), ("1Ti", 1024 * 1024)],
)
def test_memory_quantities(text: str, mib: int) -> None:
    assert memory_mib(text) == mib


def test_bad_quantities_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"limits\.cpu"):
        parse_quantity("fast", "limits.cpu")
    with pytest.raises(ValueError, match="whole number"):
        count("1.5", "nvidia.com/gpu")
    assert parse_quantity("100n") == Decimal("1.00E-7")


def test_snapshot_values_are_hashable_and_equal_values_hash_alike() -> None:
    from tessera.cluster.domain import Pod, PodRequirements

    a = Node("n", 1, 1, labels={"x": "1"}, resource_version="3")
    b = Node("n", 1, 1, labels={"x": "1"}, resource_version="3")
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    p = Pod("ns", "p", PodRequirements(node_selector={"a": "b"}), labels={"k": "v"})
    assert hash(p) == hash(Pod("ns", "p", PodRequirements(node_selector={"a": "b"}), labels={"k": "v"}))
