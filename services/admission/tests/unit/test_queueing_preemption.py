"""Preemption: priority within a queue with minimal victims, reclaim within the cohort,
borrowing while preempting with a priority threshold, release and deadlines."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tessera.admission.domain.queueing import (
    Admit,
    Decision,
    Preempt,
    PreemptionReason,
    PreemptionTiming,
    QueueingConfig,
    QueueingEngine,
    QueueSpec,
    ReclaimPolicy,
    Wait,
    WaitReason,
    WithinQueuePolicy,
)
from tessera.admission.domain.queueing.builders import a_job, a_queue
from tessera.admission.domain.queueing.preemption import victim_order_key

TIMING = PreemptionTiming(checkpoint_grace_s=120.0, default_grace_s=30.0, release_timeout_s=60.0)


def engine_of(*queues: QueueSpec) -> QueueingEngine:
    return QueueingEngine(QueueingConfig.build(flavors=["a100"], queues=queues, timing=TIMING))


def preempts(decisions: Sequence[Decision]) -> list[Preempt]:
    return [d for d in decisions if isinstance(d, Preempt)]


def admits(decisions: Sequence[Decision]) -> list[str]:
    return [d.job for d in decisions if isinstance(d, Admit)]


@pytest.mark.parametrize(
    "b_jobs",
    [
        pytest.param({"b-train": (4, 2)}, id="one 2x4-GPU gang"),
        pytest.param({"b-1": (4, 1), "b-2": (4, 1)}, id="two 4-GPU jobs"),
        pytest.param({f"b-{i}": (1, 1) for i in range(8)}, id="eight 1-GPU jobs"),
    ],
)
def test_scenario_tenant_b_reclaims_its_nominal_quota_from_tenant_a(
    b_jobs: dict[str, tuple[int, int]],
) -> None:
    """A and B share a 16-GPU cohort, 8 nominal each. A fills all 16 by borrowing; B then asks
    for 8 GPUs: A's newest jobs are the victims, and B is admitted once they are released."""
    engine = engine_of(
        a_queue("team-a").cohort("shared").nominal(gpu=8).build(),
        a_queue("team-b").cohort("shared").nominal(gpu=8).build(),
    )
    for i in range(4):  # A's jobs arrive and start one cycle apart: a0 oldest, a3 newest
        engine.submit(a_job(f"a{i}").queue("team-a").gpus(4).at(float(i)).build())
        assert admits(engine.run_cycle(float(i)).decisions) == [f"a{i}"]
    assert engine.queue_usage("team-a")[("a100", "gpu")] == 16

    for t, (name, (per_pod, pods)) in enumerate(b_jobs.items()):
        engine.submit(a_job(name).queue("team-b").gpus(per_pod, pods=pods).at(10.0 + t).build())
    first = engine.run_cycle(10.0)
    victims = preempts(first.decisions)
    assert sorted(v.victim for v in victims) == ["a2", "a3"]
    assert {v.reason for v in victims} == {PreemptionReason.RECLAIM_WITHIN_COHORT}
    assert {v.preemptor for v in victims} <= set(b_jobs)
    assert all(first.waits[name] is WaitReason.WAITING_FOR_VICTIMS for name in b_jobs)
    assert admits(first.decisions) == []
    # Nobody else may take the reclaimed room while the victims drain.
    engine.submit(a_job("a-late").queue("team-a").gpus(1).at(10.5).build())
    assert engine.run_cycle(10.5).waits["a-late"] is WaitReason.QUOTA_EXHAUSTED

    engine.release("a3")
    engine.release("a2")
    after = engine.run_cycle(12.0)
    assert sorted(admits(after.decisions)) == sorted(b_jobs)
    assert all(not d.borrows for d in after.decisions if isinstance(d, Admit))
    assert engine.queue_usage("team-a")[("a100", "gpu")] == 8
    assert engine.queue_usage("team-b")[("a100", "gpu")] == 8
    assert engine.is_admitted("a0") and engine.is_admitted("a1")


def test_scenario_preemptor_waits_until_every_victim_is_released() -> None:
    engine = engine_of(
        a_queue("team-a").cohort("shared").nominal(gpu=8).build(),
        a_queue("team-b").cohort("shared").nominal(gpu=8).build(),
    )
    for i in range(4):
        engine.submit(a_job(f"a{i}").queue("team-a").gpus(4).at(float(i)).build())
        engine.run_cycle(float(i))
    engine.submit(a_job("b-train").queue("team-b").gpus(4, pods=2).at(10.0).build())
    engine.run_cycle(10.0)
    engine.release("a3")
    second = engine.run_cycle(11.0)
    assert admits(second.decisions) == []
    [wait] = [d for d in second.decisions if isinstance(d, Wait)]
    assert (wait.job, wait.reason, wait.message) == (
        "b-train",
        WaitReason.WAITING_FOR_VICTIMS,
        "waiting for a2",
    )
    engine.release("a2")
    assert admits(engine.run_cycle(12.0).decisions) == ["b-train"]


def test_quota_freed_by_victims_is_kept_for_the_preemptor() -> None:
    engine = engine_of(
        a_queue("a").cohort("c").nominal(gpu=8).build(),
        a_queue("b").cohort("c").nominal(gpu=8).build(),
    )
    for i in range(16):
        engine.submit(a_job(f"a{i}").queue("a").gpus(1).at(float(i)).build())
    engine.run_cycle(0.0)
    engine.submit(a_job("b-big").queue("b").gpus(8).at(20.0).build())
    engine.submit(a_job("b-more").queue("b").gpus(1).at(21.0).build())
    engine.submit(a_job("a-late").queue("a").gpus(1).at(22.0).build())
    result = engine.run_cycle(30.0)
    # Exactly the 8 borrowed GPUs are reclaimed, once: b-more finds nothing left to reclaim.
    assert len(preempts(result.decisions)) == 8
    assert result.waits["b-more"] is WaitReason.QUOTA_EXHAUSTED
    assert result.waits["a-late"] is WaitReason.QUOTA_EXHAUSTED


@pytest.mark.parametrize(
    ("running", "incoming", "expected_victims"),
    [
        pytest.param(
            [("low-1", 1, 2), ("low-2", 1, 2), ("mid", 5, 2), ("high", 10, 2)],
            ("urgent", 9, 2),
            ["low-2"],
            id="one low-priority victim is enough",
        ),
        pytest.param(
            [("low-old", 1, 4), ("low-new", 1, 2), ("mid", 5, 2)],
            ("urgent", 9, 4),
            ["low-old"],
            id="fewest disturbed: one 4-GPU victim rather than two",
        ),
        pytest.param(
            [("p1", 1, 2), ("p2", 2, 2), ("p3", 3, 2), ("p4", 4, 2)],
            ("urgent", 9, 4),
            ["p1", "p2"],
            id="lowest priorities first",
        ),
        pytest.param(
            [("same-1", 5, 4), ("same-2", 5, 4)],
            ("peer", 5, 4),
            [],
            id="equal priority is never preempted within the queue",
        ),
    ],
)
def test_priority_preemption_within_a_queue_takes_minimal_victims(
    running: list[tuple[str, int, int]], incoming: tuple[str, int, int], expected_victims: list[str]
) -> None:
    engine = engine_of(a_queue("q").nominal(gpu=8).build())
    for t, (name, priority, gpus) in enumerate(running):
        engine.submit(a_job(name).queue("q").priority(priority).gpus(gpus).at(float(t)).build())
        engine.run_cycle(float(t))
    name, priority, gpus = incoming
    engine.submit(a_job(name).queue("q").priority(priority).gpus(gpus).at(100.0).build())
    result = engine.run_cycle(100.0)
    victims = preempts(result.decisions)
    assert sorted(v.victim for v in victims) == expected_victims
    assert all(v.reason is PreemptionReason.WITHIN_QUEUE_PRIORITY for v in victims)
    expected_wait = WaitReason.WAITING_FOR_VICTIMS if expected_victims else WaitReason.QUOTA_EXHAUSTED
    assert result.waits[name] is expected_wait


def test_most_recently_started_victim_goes_first_among_equals() -> None:
    engine = engine_of(a_queue("q").nominal(gpu=4).build())
    for t, name in enumerate(["first", "second", "third", "fourth"]):
        engine.submit(a_job(name).queue("q").priority(1).gpus(1).at(float(t)).build())
        engine.run_cycle(float(t))
    engine.submit(a_job("urgent").queue("q").priority(9).gpus(1).at(10.0).build())
    assert [v.victim for v in preempts(engine.run_cycle(10.0).decisions)] == ["fourth"]


def test_non_preemptible_jobs_are_never_victims() -> None:
    engine = engine_of(a_queue("q").nominal(gpu=2).build())
    engine.submit(a_job("pinned").queue("q").priority(0).gpus(2).not_preemptible().build())
    engine.run_cycle(0.0)
    engine.submit(a_job("urgent").queue("q").priority(9).gpus(1).at(1.0).build())
    result = engine.run_cycle(1.0)
    assert preempts(result.decisions) == []
    assert result.waits["urgent"] is WaitReason.QUOTA_EXHAUSTED


@pytest.mark.parametrize(
    ("policy", "borrower_priority", "expected"),
    [
        pytest.param(ReclaimPolicy.ANY, 50, ["borrowed"], id="any: reclaims whatever the priority"),
        pytest.param(ReclaimPolicy.LOWER_PRIORITY, 50, [], id="lower-priority: spares a higher one"),
        pytest.param(ReclaimPolicy.LOWER_PRIORITY, 1, ["borrowed"], id="lower-priority: reclaims a lower"),
        pytest.param(ReclaimPolicy.NEVER, 1, [], id="never"),
    ],
)
def test_reclaim_within_cohort_policy(
    policy: ReclaimPolicy, borrower_priority: int, expected: list[str]
) -> None:
    engine = engine_of(
        a_queue("lender").cohort("c").nominal(gpu=4).preemption(reclaim=policy).build(),
        a_queue("borrower").cohort("c").nominal(gpu=4).build(),
    )
    engine.submit(a_job("own").queue("borrower").priority(borrower_priority).gpus(4).at(0.0).build())
    engine.submit(a_job("borrowed").queue("borrower").priority(borrower_priority).gpus(4).at(1.0).build())
    engine.run_cycle(1.0)
    engine.submit(a_job("back").queue("lender").priority(10).gpus(4).at(2.0).build())
    victims = preempts(engine.run_cycle(2.0).decisions)
    assert [v.victim for v in victims] == expected


def test_a_queue_within_its_nominal_quota_is_not_reclaimed_from() -> None:
    engine = engine_of(
        a_queue("a").cohort("c").nominal(gpu=4).build(),
        a_queue("b").cohort("c").nominal(gpu=4).build(),
        a_queue("x").cohort("c").nominal(gpu=0).build(),
    )
    engine.submit(a_job("b-own").queue("b").gpus(4).build())
    engine.submit(a_job("x-borrow").queue("x").gpus(4).build())
    engine.run_cycle(0.0)
    engine.submit(a_job("a-back").queue("a").gpus(4).at(1.0).build())
    assert [v.victim for v in preempts(engine.run_cycle(1.0).decisions)] == ["x-borrow"]


@pytest.mark.parametrize(
    ("threshold", "victim_priority", "expect_preemption"),
    [
        pytest.param(None, 5, True, id="no threshold: any lower priority"),
        pytest.param(5, 5, True, id="at the threshold"),
        pytest.param(4, 5, False, id="above the threshold"),
        pytest.param(None, 20, False, id="never an equal or higher priority"),
    ],
)
def test_borrow_within_cohort_with_priority_threshold(
    threshold: int | None, victim_priority: int, expect_preemption: bool
) -> None:
    engine = engine_of(
        a_queue("hungry")
        .cohort("c")
        .nominal(gpu=2)
        .preemption(reclaim=ReclaimPolicy.NEVER, borrow=True, borrow_threshold=threshold)
        .build(),
        a_queue("other").cohort("c").nominal(gpu=2).build(),
        a_queue("pool").cohort("c").nominal(gpu=4).build(),
    )
    engine.submit(a_job("other-borrows").queue("other").priority(victim_priority).gpus(6).build())
    engine.run_cycle(0.0)
    engine.submit(a_job("wants-4").queue("hungry").priority(10).gpus(4).at(1.0).build())
    victims = preempts(engine.run_cycle(1.0).decisions)
    assert [v.victim for v in victims] == (["other-borrows"] if expect_preemption else [])
    assert all(v.reason is PreemptionReason.BORROW_WITHIN_COHORT for v in victims)


def test_checkpointable_victims_get_a_grace_period_and_a_later_deadline() -> None:
    engine = engine_of(a_queue("q").nominal(gpu=2).build())
    engine.submit(a_job("plain").queue("q").gpus(1).at(0.0).build())
    engine.submit(a_job("saver").queue("q").gpus(1).checkpointable().at(1.0).build())
    engine.run_cycle(1.0)
    engine.submit(a_job("urgent").queue("q").priority(9).gpus(2).at(2.0).build())
    victims = {v.victim: v for v in preempts(engine.run_cycle(10.0).decisions)}
    assert victims["saver"].grace_period_s == 120.0
    assert victims["plain"].grace_period_s == 30.0
    assert victims["plain"].deadline == victims["saver"].deadline == 10.0 + 120.0 + 60.0


def test_victims_that_never_report_released_are_forced_out_at_the_deadline() -> None:
    engine = engine_of(a_queue("q").nominal(gpu=2).build())
    engine.submit(a_job("stuck").queue("q").gpus(2).build())
    engine.run_cycle(0.0)
    engine.submit(a_job("urgent").queue("q").priority(9).gpus(2).at(1.0).build())
    [requested] = preempts(engine.run_cycle(1.0).decisions)
    assert engine.run_cycle(requested.deadline - 1).waits["urgent"] is WaitReason.WAITING_FOR_VICTIMS
    overdue = engine.run_cycle(requested.deadline).decisions
    [forced] = preempts(overdue)
    assert (forced.victim, forced.forced, forced.grace_period_s) == ("stuck", True, 0.0)
    assert admits(overdue) == ["urgent"]
    assert not engine.is_admitted("stuck")


def test_wait_decisions_are_emitted_only_when_the_reason_changes() -> None:
    engine = engine_of(a_queue("q").nominal(gpu=1).preemption(within_queue=WithinQueuePolicy.NEVER).build())
    engine.submit(a_job("holder").queue("q").gpus(1).build())
    engine.submit(a_job("waiter").queue("q").gpus(1).at(1.0).build())
    first = engine.run_cycle(0.0)
    assert [d.job for d in first.decisions if isinstance(d, Wait)] == ["waiter"]
    second = engine.run_cycle(1.0)
    assert [d for d in second.decisions if isinstance(d, Wait)] == []
    assert second.waits == {"waiter": WaitReason.QUOTA_EXHAUSTED}
    assert engine.wait_reason("waiter") is WaitReason.QUOTA_EXHAUSTED


def test_cancelling_a_preemptor_gives_its_reservation_back() -> None:
    engine = engine_of(a_queue("q").nominal(gpu=2).build())
    engine.submit(a_job("low").queue("q").gpus(2).build())
    engine.run_cycle(0.0)
    engine.submit(a_job("urgent").queue("q").priority(9).gpus(2).at(1.0).build())
    engine.run_cycle(1.0)
    assert engine.inflight("urgent") is not None
    engine.cancel("urgent")
    engine.release("low")
    assert engine.queue_usage("q")[("a100", "gpu")] == 0


# ---- checkpoint-aware victims --------------------------------------------------------------------


def running_team(jobs: Sequence[tuple[str, int, float, float | None]]) -> QueueingEngine:
    """One 4-GPU queue full of 1-GPU jobs (name, priority, admitted at, newest checkpoint at)."""
    engine = engine_of(a_queue("team").nominal(gpu=len(jobs)).build())
    for i, (name, priority, admitted_at, checkpointed_at) in enumerate(jobs):
        job = a_job(name).queue("team").gpus(1).priority(priority).checkpointable().at(float(i)).build()
        engine.restore_admitted(job, ("a100",), admitted_at, checkpointed_at)
    return engine


def victim_for(engine: QueueingEngine, now: float = 100.0) -> list[str]:
    engine.submit(a_job("urgent").queue("team").gpus(1).priority(50).at(now).build())
    return [p.victim for p in preempts(engine.run_cycle(now).decisions)]


def test_among_equals_the_job_that_checkpointed_last_is_preempted_first() -> None:
    """Same priority, admitted in the same cycle: each checkpointed at a different time, or not yet
    (created last, so Kueue's order alone would pick it)."""
    jobs = [("ckpt-old", 0, 10.0, 30.0), ("ckpt-new", 0, 10.0, 90.0), ("ckpt-mid", 0, 10.0, 60.0)]
    assert victim_for(running_team([*jobs, ("no-ckpt", 0, 10.0, None)])) == ["ckpt-new"]

    order = sorted(
        (
            a
            for q in running_team([*jobs, ("no-ckpt", 0, 10.0, None)]).cohort_admitted("team").values()
            for a in q.values()
        ),
        key=lambda a: victim_order_key("other", a),
    )
    assert [a.name for a in order] == ["ckpt-new", "ckpt-mid", "ckpt-old", "no-ckpt"]


def test_a_checkpointable_job_with_no_checkpoint_yet_ranks_after_one_with_a_recent_checkpoint() -> None:
    # "fresh" was created after "saved", so without checkpoints it would be the victim.
    assert victim_for(running_team([("saved", 0, 10.0, None), ("fresh", 0, 10.0, None)])) == ["fresh"]
    assert victim_for(running_team([("saved", 0, 10.0, 95.0), ("fresh", 0, 10.0, None)])) == ["saved"]


def test_work_counts_from_the_newest_checkpoint_or_the_admission_whichever_is_later() -> None:
    """`resumed` was admitted again at 80 with a checkpoint from before its preemption (at 20): it
    has lost 20 s of work, `steady` (admitted at 0, checkpointed at 60) 40 s."""
    assert victim_for(running_team([("resumed", 0, 80.0, 20.0), ("steady", 0, 0.0, 60.0)])) == ["resumed"]
    # Without checkpoints it is Kueue's order: the most recently admitted.
    assert victim_for(running_team([("first", 0, 0.0, None), ("last", 0, 50.0, None)])) == ["last"]


def test_priority_still_comes_before_checkpoints() -> None:
    jobs = [("low-unsaved", 0, 10.0, None), ("mid-just-saved", 5, 10.0, 99.0)]
    assert victim_for(running_team(jobs)) == ["low-unsaved"]
