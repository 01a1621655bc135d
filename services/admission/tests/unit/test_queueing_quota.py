"""Quota arithmetic: nominal vs borrowed admission, lending and borrowing limits, validation."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tessera.admission.domain.queueing import (
    Admit,
    CohortSpec,
    Decision,
    FlavorQuotas,
    Preempt,
    PriorityClass,
    QueueingConfig,
    QueueingEngine,
    QueueingValidationError,
    QueueSpec,
    ResourceQuota,
    TenantQueue,
    WaitReason,
)
from tessera.admission.domain.queueing.builders import a_job, a_queue
from tessera.admission.domain.queueing.quota import QuotaTree

FLAVORS = ("a100", "t4")


def engine_of(*queues: QueueSpec, cohorts: tuple[CohortSpec, ...] = ()) -> QueueingEngine:
    return QueueingEngine(QueueingConfig.build(flavors=FLAVORS, queues=queues, cohorts=cohorts))


def admitted_names_of(decisions: Sequence[Decision]) -> list[str]:
    return [d.job for d in decisions if isinstance(d, Admit)]


def admitted_names(engine: QueueingEngine, now: float = 0.0) -> list[str]:
    return [d.job for d in engine.run_cycle(now).decisions if isinstance(d, Admit)]


@pytest.mark.parametrize(
    ("a_limits", "b_limits", "a_jobs", "expected_admitted", "expected_borrows"),
    [
        pytest.param({}, {}, [4, 4], ["j0", "j1"], [False, False], id="within nominal"),
        pytest.param({}, {}, [8, 4], ["j0", "j1"], [False, True], id="borrows the idle neighbour's quota"),
        pytest.param({}, {}, [8, 8, 1], ["j0", "j1"], [False, True], id="cohort full: nothing beyond 16"),
        pytest.param(
            {"borrowing_limit": 2}, {}, [8, 4, 2], ["j0", "j2"], [False, True], id="borrowing limit"
        ),
        pytest.param({}, {"lending_limit": 3}, [8, 4, 3], ["j0", "j2"], [False, True], id="lending limit"),
        pytest.param({}, {"lending_limit": 0}, [8, 1], ["j0"], [False], id="lends nothing"),
    ],
)
def test_nominal_and_borrowed_admission(
    a_limits: dict[str, int],
    b_limits: dict[str, int],
    a_jobs: list[int],
    expected_admitted: list[str],
    expected_borrows: list[bool],
) -> None:
    engine = engine_of(
        a_queue("a").cohort("c").nominal(gpu=8, **a_limits).build(),  # type: ignore[arg-type]
        a_queue("b").cohort("c").nominal(gpu=8, **b_limits).build(),  # type: ignore[arg-type]
    )
    for i, gpus in enumerate(a_jobs):
        engine.submit(a_job(f"j{i}").queue("a").gpus(gpus).at(i).build())
    decisions = [d for d in engine.run_cycle(0.0).decisions if isinstance(d, Admit)]
    assert [d.job for d in decisions] == expected_admitted
    assert [d.borrows for d in decisions] == expected_borrows


def test_lent_quota_is_still_guaranteed_to_the_lender() -> None:
    engine = engine_of(
        a_queue("a").cohort("c").nominal(gpu=8).build(),
        a_queue("b").cohort("c").nominal(gpu=8, lending_limit=3).build(),
    )
    engine.submit(a_job("a-big").queue("a").gpus(11).build())
    engine.submit(a_job("b-small").queue("b").gpus(5).build())
    assert sorted(admitted_names(engine)) == ["a-big", "b-small"]
    assert engine.tree.available("a", ("a100", "gpu")) == 0
    assert engine.tree.available("b", ("a100", "gpu")) == 0


def test_nested_cohorts_lend_up_and_down_the_tree() -> None:
    cohorts = (
        CohortSpec("org"),
        CohortSpec("team-x", parent="org"),
        CohortSpec("team-y", parent="org", flavors=(FlavorQuotas("a100", {"gpu": ResourceQuota(4)}),)),
    )
    engine = engine_of(
        a_queue("x1").cohort("team-x").nominal(gpu=2).build(),
        a_queue("y1").cohort("team-y").nominal(gpu=2, borrowing_limit=10).build(),
        cohorts=cohorts,
    )
    tree = engine.tree
    assert tree.potential_available("x1", ("a100", "gpu")) == 8
    assert tree.potential_available("y1", ("a100", "gpu")) == 8
    engine.submit(a_job("x").queue("x1").gpus(7).build())
    assert admitted_names(engine) == ["x"]
    assert tree.available("y1", ("a100", "gpu")) == 1
    engine.release("x")
    assert tree.available("y1", ("a100", "gpu")) == 8


def test_usage_is_accounted_incrementally_and_released() -> None:
    engine = engine_of(a_queue("a").nominal(gpu=4, cpu=8000).build())
    engine.submit(a_job("j").queue("a").gpus(2, pods=2, cpu=2000).build())
    assert admitted_names(engine) == ["j"]
    assert dict(engine.queue_usage("a")) == {("a100", "gpu"): 4, ("a100", "cpu"): 4000}
    engine.release("j")
    assert dict(engine.queue_usage("a")) == {("a100", "gpu"): 0, ("a100", "cpu"): 0}


def test_flavor_assignment_falls_through_to_the_next_allowed_flavor() -> None:
    engine = engine_of(a_queue("a").nominal(gpu=2, flavor="a100").nominal(gpu=8, flavor="t4").build())
    engine.submit(a_job("first").queue("a").gpus(2).at(0).build())
    engine.submit(a_job("second").queue("a").gpus(2).at(1).build())
    engine.submit(a_job("a100-only").queue("a").flavors("a100").gpus(1).at(2).build())
    result = engine.run_cycle(0.0)
    admits = {d.job: d.flavors for d in result.decisions if isinstance(d, Admit)}
    assert admits == {"first": ("a100",), "second": ("t4",)}
    assert result.waits["a100-only"] is WaitReason.QUOTA_EXHAUSTED


def test_each_pod_group_gets_its_own_flavor_with_quota_accounted_per_flavor() -> None:
    engine = engine_of(a_queue("a").nominal(gpu=4, flavor="a100").nominal(gpu=4, flavor="t4").build())
    job = (
        a_job("two-groups").queue("a").gpus(1, pods=3, group="trainer").gpus(1, pods=3, group="eval").build()
    )
    engine.submit(job)
    [admit] = [d for d in engine.run_cycle(0.0).decisions if isinstance(d, Admit)]
    assert admit.flavors == ("a100", "t4")
    assert admit.usage == {("a100", "gpu"): 3, ("t4", "gpu"): 3}


def _queue(name: str, nominal: int = 8, **limits: int | None) -> QueueSpec:
    return QueueSpec(name, (FlavorQuotas("a100", {"gpu": ResourceQuota(nominal, **limits)}),), cohort="c")


@pytest.mark.parametrize(
    ("build", "field", "reason"),
    [
        pytest.param(
            lambda: QueueingConfig.build(flavors=FLAVORS, queues=[_queue("a", nominal=-1)]),
            "queues.a.flavors.a100.gpu.nominal",
            "quota below zero",
            id="negative nominal",
        ),
        pytest.param(
            lambda: QueueingConfig.build(flavors=FLAVORS, queues=[_queue("a", borrowing_limit=-2)]),
            "queues.a.flavors.a100.gpu.borrowing_limit",
            "quota below zero",
            id="negative borrowing limit",
        ),
        pytest.param(
            lambda: QueueingConfig.build(flavors=["t4"], queues=[_queue("a")]),
            "queues.a.flavors.a100",
            "unknown flavor",
            id="unknown flavor in a queue",
        ),
        pytest.param(
            lambda: QueueingConfig.build(
                flavors=FLAVORS,
                queues=[_queue("a")],
                cohorts=[
                    CohortSpec("c", parent="d"),
                    CohortSpec("d", parent="e"),
                    CohortSpec("e", parent="c"),
                ],
            ),
            "cohorts.c.parent",
            "cohort cycle c -> d -> e -> c",
            id="cohort cycle",
        ),
        pytest.param(
            lambda: QueueingConfig.build(
                flavors=FLAVORS, queues=[_queue("a")], tenant_queues=[TenantQueue("team", "nope")]
            ),
            "tenant_queues.team.queue",
            "unknown queue",
            id="tenant mapped to an unknown queue",
        ),
        pytest.param(
            lambda: QueueingConfig.build(flavors=FLAVORS, queues=[_queue("a", lending_limit=9)]),
            "queues.a.flavors.a100.gpu.lending_limit",
            "exceeds the nominal quota",
            id="lending more than nominal",
        ),
    ],
)
def test_bad_configuration_names_the_field(build: object, field: str, reason: str) -> None:
    with pytest.raises(QueueingValidationError) as err:
        build()  # type: ignore[operator]
    assert err.value.field == field
    assert reason in err.value.reason


@pytest.mark.parametrize(
    ("job", "field", "reason"),
    [
        pytest.param(
            a_job("big").queue("a").gpus(8, pods=3), "pod_groups[0].requests.gpu", "exceeds queue capacity"
        ),
        pytest.param(
            a_job("sum").queue("a").gpus(8, pods=2).gpus(1, pods=1),
            "requests.gpu",
            "exceeds queue capacity",
            id="groups together exceed the cohort",
        ),
        pytest.param(a_job("q").queue("nowhere").gpus(1), "queue", "unknown queue"),
        pytest.param(
            a_job("f").queue("a").flavors("v100").gpus(1), "pod_groups[0].flavors", "unknown flavor"
        ),
        pytest.param(a_job("t").queue("a").flavors("t4").gpus(1), "pod_groups[0].flavors", "offers none"),
        pytest.param(
            a_job("n").queue("a").group(None, 1, gpu=-1), "pod_groups[0].requests.gpu", "below zero"
        ),
        pytest.param(a_job("m").queue("a").mig("1g.10gb"), "pod_groups[0].requests.mig-1g.10gb", "exceeds"),
    ],
)
def test_bad_workload_names_the_field(job: object, field: str, reason: str) -> None:
    config = QueueingConfig.build(flavors=FLAVORS, queues=[_queue("a"), _queue("b")])
    engine = QueueingEngine(config)
    with pytest.raises(QueueingValidationError) as err:
        engine.submit(job.build())  # type: ignore[attr-defined]
    assert err.value.field == field
    assert reason in err.value.reason
    assert engine.pending_count() == 0


def test_quota_tree_reports_borrowing_per_flavor() -> None:
    config = QueueingConfig.build(
        flavors=FLAVORS,
        queues=[
            a_queue("a").cohort("c").nominal(gpu=2).build(),
            a_queue("b").cohort("c").nominal(gpu=2).build(),
        ],
    )
    tree = QuotaTree(config)
    tree.add_usage("a", {("a100", "gpu"): 3})
    assert tree.is_borrowing("a", ("a100", "gpu"))
    assert not tree.is_borrowing("b", ("a100", "gpu"))
    assert tree.available("b", ("a100", "gpu")) == 1
    tree.remove_usage("a", {("a100", "gpu"): 3})
    assert tree.available("b", ("a100", "gpu")) == 4


def test_tenants_and_priority_classes_resolve_or_name_the_field() -> None:
    config = QueueingConfig.build(
        flavors=FLAVORS,
        queues=[_queue("research")],
        tenant_queues=[TenantQueue("vision-team", "research")],
        priority_classes=[PriorityClass("batch", 10), PriorityClass("prod", 1000)],
    )
    assert config.queue_for_tenant("vision-team") == "research"
    assert config.priority_of("prod") == 1000
    with pytest.raises(QueueingValidationError) as tenant_err:
        config.queue_for_tenant("nobody")
    assert tenant_err.value.field == "tenant"
    with pytest.raises(QueueingValidationError) as class_err:
        config.priority_of("urgent")
    assert class_err.value.field == "priority_class"


def test_the_same_job_name_cannot_be_queued_twice() -> None:
    engine = engine_of(a_queue("a").nominal(gpu=4).build())
    engine.submit(a_job("j").queue("a").gpus(1).build())
    with pytest.raises(QueueingValidationError) as err:
        engine.submit(a_job("j").queue("a").gpus(1).build())
    assert err.value.field == "name"


def test_state_rebuilt_after_a_restart_holds_the_same_quota() -> None:
    engine = engine_of(
        a_queue("a").cohort("c").nominal(gpu=4).build(), a_queue("b").cohort("c").nominal(gpu=4).build()
    )
    engine.restore_admitted(a_job("old").queue("a").gpus(3, pods=2).build(), ("a100",), admitted_at=5.0)
    assert engine.tree.available("b", ("a100", "gpu")) == 2
    engine.submit(a_job("fits").queue("b").gpus(2).build())
    engine.submit(a_job("reclaims").queue("b").gpus(2).at(1.0).build())
    result = engine.run_cycle(6.0)
    assert admitted_names_of(result.decisions) == ["fits"]
    assert result.waits == {"reclaims": WaitReason.WAITING_FOR_VICTIMS}
    assert [d.victim for d in result.decisions if isinstance(d, Preempt)] == ["old"]
    with pytest.raises(QueueingValidationError) as err:
        engine.restore_admitted(a_job("x").queue("a").gpus(1).build(), ("h100",), admitted_at=5.0)
    assert err.value.field == "flavors"


def test_an_admission_that_could_not_be_persisted_is_rolled_back_and_requeued() -> None:
    engine = engine_of(a_queue("a").nominal(gpu=4).build())
    engine.submit(a_job("j").queue("a").gpus(4).build())
    assert admitted_names(engine) == ["j"]
    engine.unadmit("j")
    assert engine.is_pending("j") and not engine.is_admitted("j")
    assert engine.queue_usage("a")[("a100", "gpu")] == 0
    assert admitted_names(engine, now=1.0) == ["j"]
