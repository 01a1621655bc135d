from __future__ import annotations

import pytest

from tessera.contracts.jobs import JobSpec
from tessera.scheduler.domain.first_fit import FreeGpu, FreeNode, place_gang


def node(
    name: str,
    gpus: int = 8,
    model: str = "A100-80GB",
    free: int = 1000,
    healthy: bool = True,
    cpu: int = 64000,
) -> FreeNode:
    return FreeNode(name, cpu, 512000, [FreeGpu(i, f"{name}-{i}", model, free, healthy) for i in range(gpus)])


def job(*groups: dict[str, object]) -> JobSpec:
    return JobSpec.model_validate({"name": "j", "tenant": "t", "pod_groups": list(groups)})


def test_a_gang_is_placed_whole_first_fit() -> None:
    spec = job({"name": "w", "replicas": 2, "gpu": {"count": 4}})
    fit = place_gang("j", spec, [node("a"), node("b")])
    assert fit.placed
    assert [(p.pod, p.node, [g.index for g in p.gpus]) for p in fit.placements] == [
        ("j-w-0", "a", [0, 1, 2, 3]),
        ("j-w-1", "a", [4, 5, 6, 7]),
    ]


def test_all_or_nothing_when_the_last_pod_does_not_fit() -> None:
    spec = job({"name": "w", "replicas": 3, "gpu": {"count": 8}})
    nodes = [node("a"), node("b")]
    fit = place_gang("j", spec, nodes)
    assert not fit.placed and fit.placements == []
    assert fit.rejected == {"insufficient GPU": 2}


def test_min_available_is_the_quorum_placed() -> None:
    fit = place_gang(
        "j",
        job({"name": "w", "replicas": 4, "min_available": 2, "gpu": {"count": 8}}),
        [node("a"), node("b")],
    )
    assert len(fit.placements) == 2


@pytest.mark.parametrize(
    ("nodes", "gpu", "reason"),
    [
        ([node("a", model="T4")], {"count": 1, "models": ["A100-80GB"]}, "GPU model not allowed"),
        ([node("a", healthy=False)], {"count": 1}, "unhealthy GPU"),
        ([node("a", cpu=1000)], {"count": 1}, "insufficient cpu"),
        ([node("a")], {"mig_profile": "1g.10gb"}, "MIG slices not offered"),
    ],
)
def test_rejections_carry_a_reason_per_node(
    nodes: list[FreeNode], gpu: dict[str, object], reason: str
) -> None:
    fit = place_gang("j", job({"name": "w", "replicas": 1, "cpu": "4", "gpu": gpu}), nodes)
    assert fit.rejected == {reason: 1}
    assert fit.message() == f"{reason} on 1 node"


def test_fractional_pods_share_a_gpu() -> None:
    fit = place_gang("j", job({"name": "s", "replicas": 3, "gpu": {"milli": 300}}), [node("a", gpus=1)])
    assert fit.placed
    assert {g.index for p in fit.placements for g in p.gpus} == {0}
    assert not place_gang(
        "j", job({"name": "s", "replicas": 4, "gpu": {"milli": 300}}), [node("a", gpus=1)]
    ).placed
