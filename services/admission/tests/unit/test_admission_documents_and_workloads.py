"""The operator's documents onto the queueing model, job specs onto workloads, open mode, and the
free shape built from telemetry's inventory. Pure."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.admission.adapters.config_repository import StoredConfig
from tessera.admission.domain.documents import QueueingDocument
from tessera.admission.domain.queueing import (
    QueueingEngine,
    QueueingStrategy,
    QueueingValidationError,
    ReclaimPolicy,
    ResourceQuota,
)
from tessera.admission.domain.queueing.builders import a_job
from tessera.admission.domain.workloads import groups_of, open_config, tenant_queue, to_workload
from tessera.admission.service_layer.shape_view import free_shape
from tessera.contracts.jobs import JobSpec

DOC: dict[str, Any] = {
    "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}, {"name": "t4"}],
    "cohorts": [{"name": "org"}, {"name": "research", "parent": "org"}],
    "queues": [
        {
            "name": "team-a",
            "cohort": "research",
            "strategy": "strict-fifo",
            "quotas": [
                {
                    "flavor": "a100-80gb",
                    "resources": {"gpu": {"nominal": 8, "lending_limit": 4}, "cpu": 64000},
                },
                {"flavor": "t4", "resources": {"gpu": 2}},
            ],
            "preemption": {"reclaim_within_cohort": "lower-priority"},
        }
    ],
    "tenant_queues": [{"tenant": "research", "queue": "team-a"}],
    "priority_classes": [{"name": "high", "value": 1000}],
}


def config(**changes: Any) -> Any:
    return StoredConfig().merged(QueueingDocument.model_validate({**DOC, **changes})).build()


def spec(**overrides: Any) -> JobSpec:
    gpu = overrides.pop("gpu", {"count": 2, "models": ["A100-80GB"]})
    base = {
        "name": "j",
        "tenant": "research",
        "pod_groups": [{"name": "w", "replicas": 2, "cpu": "4", "gpu": gpu}],
    }
    return JobSpec.model_validate({**base, **overrides})


def test_a_document_becomes_the_queueing_model() -> None:
    cfg = config()
    queue = cfg.queues["team-a"]
    assert queue.strategy is QueueingStrategy.STRICT_FIFO
    assert queue.flavor_order == ("a100-80gb", "t4")
    assert queue.quotas[("a100-80gb", "gpu")] == ResourceQuota(8, None, 4)
    assert queue.quotas[("a100-80gb", "cpu")] == ResourceQuota(64000)
    assert queue.preemption.reclaim_within_cohort is ReclaimPolicy.LOWER_PRIORITY
    assert cfg.cohorts["research"].parent == "org"
    assert cfg.priority_of("high") == 1000


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (
            {"cohorts": [{"name": "org", "parent": "research"}, {"name": "research", "parent": "org"}]},
            "cohorts.org.parent",
        ),
        ({"flavors": [{"name": "t4"}]}, "queues.team-a.flavors.a100-80gb"),
        ({"tenant_queues": [{"tenant": "x", "queue": "nope"}]}, "tenant_queues.x.queue"),
        ({"tenant_queues": [{"tenant": "unknown", "queue": "team-a"}]}, "tenant_queues.unknown.tenant"),
    ],
)
def test_a_bad_document_names_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(QueueingValidationError) as caught:
        config(**changes)
    assert caught.value.field == field


def test_a_tenant_queue_cannot_name_the_tenant_of_unattributed_usage() -> None:
    with pytest.raises(QueueingValidationError) as caught:
        config(tenant_queues=[{"tenant": "unknown", "queue": "team-a"}])
    assert "'unknown' is reserved for usage no job is known for" in caught.value.reason


def test_merging_replaces_by_name_and_keeps_the_rest() -> None:
    before = StoredConfig().merged(QueueingDocument.model_validate(DOC))
    after = before.merged(
        QueueingDocument.model_validate({"priority_classes": [{"name": "high", "value": 5}]})
    )
    assert [(p.name, p.value) for p in after.priority_classes] == [("high", 5)]
    assert after.queues == before.queues and not after.open_mode
    assert StoredConfig().open_mode


@pytest.mark.parametrize(
    ("gpu", "requests", "flavors"),
    [
        ({"count": 2, "models": ["A100-80GB"]}, {"gpu": 2, "cpu": 4000}, frozenset({"a100-80gb"})),
        (
            {"count": 1, "models": ["A100-80GB", "H100-80GB"]},
            {"gpu": 1, "cpu": 4000},
            frozenset({"a100-80gb"}),
        ),
        ({"milli": 250}, {"gpu-milli": 250, "cpu": 4000}, frozenset()),
        ({"mig_profile": "1g.10gb", "models": ["H9"]}, {"mig-1g.10gb": 1, "cpu": 4000}, frozenset({"h9"})),
    ],
)
def test_job_specs_become_workloads(
    gpu: dict[str, Any], requests: dict[str, int], flavors: frozenset[str]
) -> None:
    cfg = config()
    workload = to_workload(
        "j1",
        "team-a",
        groups_of(spec(gpu=gpu)),
        priority=5,
        created_at=1.0,
        preemptible=True,
        checkpointable=True,
        config=cfg,
        open_mode=False,
    )
    (group,) = workload.pod_groups
    assert (group.count, dict(group.requests), group.flavors) == (2, requests, flavors)
    assert "memory" not in group.requests, "memory counts only in queues that name it"
    assert (workload.priority, workload.checkpointable) == (5, True)


def test_a_job_asking_more_than_the_cohort_holds_is_refused() -> None:
    cfg = config()
    workload = to_workload(
        "j1",
        "team-a",
        groups_of(spec(gpu={"count": 8})),
        priority=0,
        created_at=0.0,
        preemptible=True,
        checkpointable=False,
        config=cfg,
        open_mode=False,
    )
    with pytest.raises(QueueingValidationError, match="exceeds queue capacity"):
        QueueingEngine(cfg).validate(workload)


@pytest.mark.parametrize(
    ("tenant", "requested", "expected"),
    [
        ("research", "default", "team-a"),
        ("research", "team-a", "team-a"),
        ("research", "other", None),
        ("x", "default", None),
    ],
)
def test_a_tenant_submits_only_to_its_own_queue(tenant: str, requested: str, expected: str | None) -> None:
    cfg = config()
    if expected is None:
        with pytest.raises(QueueingValidationError):
            tenant_queue(cfg, tenant, requested, open_mode=False)
    else:
        assert tenant_queue(cfg, tenant, requested, open_mode=False) == expected


def test_open_mode_admits_anything_valid_in_fifo_order() -> None:
    cfg = open_config({"mig-1g.10gb"})
    engine = QueueingEngine(cfg)
    for i in range(3):
        engine.submit(
            a_job(f"j{i}")
            .queue(tenant_queue(cfg, "anyone", "default", True))
            .at(i)
            .flavors()
            .gpus(8, pods=4)
            .build()
        )
    result = engine.run_cycle(now=10.0)
    assert result.admitted == 3


def test_the_free_shape_counts_placed_gpus_and_skips_unhealthy_ones() -> None:
    gpus = [{"uuid": f"g{i}", "model": "A100-80GB", "healthy": i != 3} for i in range(4)]
    oracle = free_shape([("n1", gpus)], {"g0": 1000, "g1": 500}, {"a100-80gb": "a100-80gb"})
    assert oracle is not None
    two = a_job("two").gpus(1, pods=2).build()
    assert oracle.try_place(two, ["a100-80gb"]) is None, "g2 is the only whole free GPU; g3 is unhealthy"
    half = a_job("half").milli(500).build()
    assert oracle.try_place(half, ["a100-80gb"]) is not None
    assert free_shape([], {}, {}) is None, "no inventory yet: the shape is unknown"
