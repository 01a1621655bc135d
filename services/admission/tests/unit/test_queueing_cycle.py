"""The admission cycle: every fitting job in one cycle, strict vs best-effort FIFO, fair-share
order across queues, and topology-aware holding."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tessera.admission.domain.queueing import (
    Admit,
    Decision,
    FairSharing,
    FreeShapeOracle,
    NodeFree,
    QueueingConfig,
    QueueingEngine,
    QueueSpec,
    Wait,
    WaitReason,
)
from tessera.admission.domain.queueing.builders import a_job, a_queue


def engine_of(*queues: QueueSpec, fair: FairSharing | None = None) -> QueueingEngine:
    config = QueueingConfig.build(flavors=["a100", "t4"], queues=queues, fair_sharing=fair or FairSharing())
    return QueueingEngine(config)


def admitted(decisions: Sequence[Decision]) -> list[str]:
    return [d.job for d in decisions if isinstance(d, Admit)]


def test_every_job_that_fits_is_admitted_in_one_cycle_across_queues() -> None:
    engine = engine_of(*(a_queue(f"q{i}").nominal(gpu=10).build() for i in range(5)))
    for i in range(5):
        for j in range(12):
            engine.submit(a_job(f"q{i}-j{j}").queue(f"q{i}").gpus(1).at(float(j)).build())
    result = engine.run_cycle(0.0)
    assert result.admitted == 50
    assert sorted(result.waits.values()) == [WaitReason.QUOTA_EXHAUSTED] * 10
    assert all(engine.queue_usage(f"q{i}")[("a100", "gpu")] == 10 for i in range(5))
    assert engine.pending_count() == 10


@pytest.mark.parametrize(
    ("strict", "expected_admitted", "expected_waits"),
    [
        pytest.param(
            False,
            ["small-1", "small-2"],
            {"big": WaitReason.QUOTA_EXHAUSTED},
            id="best-effort: the big head does not block the small ones",
        ),
        pytest.param(
            True,
            [],
            {
                "big": WaitReason.QUOTA_EXHAUSTED,
                "small-1": WaitReason.BLOCKED_BY_HEAD,
                "small-2": WaitReason.BLOCKED_BY_HEAD,
            },
            id="strict: everything waits behind the head",
        ),
    ],
)
def test_strict_fifo_blocks_where_best_effort_fifo_does_not(
    strict: bool, expected_admitted: list[str], expected_waits: dict[str, WaitReason]
) -> None:
    queue = a_queue("q").nominal(gpu=4)
    engine = engine_of(
        a_queue("other").nominal(gpu=4).build(), (queue.strict_fifo() if strict else queue).build()
    )
    engine.submit(a_job("filler").queue("q").gpus(2).at(0.0).build())
    engine.run_cycle(0.0)
    engine.submit(a_job("big").queue("q").gpus(4).at(1.0).build())
    engine.submit(a_job("small-1").queue("q").gpus(1).at(2.0).build())
    engine.submit(a_job("small-2").queue("q").gpus(1).at(3.0).build())
    engine.submit(a_job("elsewhere").queue("other").gpus(1).at(4.0).build())
    result = engine.run_cycle(5.0)
    assert admitted(result.decisions) == [*expected_admitted, "elsewhere"]
    assert result.waits == expected_waits


def test_strict_fifo_head_admitted_once_room_frees_then_the_rest_follow() -> None:
    engine = engine_of(a_queue("q").nominal(gpu=4).strict_fifo().build())
    engine.submit(a_job("filler").queue("q").gpus(2).at(0.0).build())
    engine.run_cycle(0.0)
    engine.submit(a_job("big").queue("q").gpus(4).at(1.0).build())
    engine.submit(a_job("small").queue("q").gpus(1).at(2.0).build())
    assert admitted(engine.run_cycle(1.0).decisions) == []
    engine.release("filler")
    assert admitted(engine.run_cycle(2.0).decisions) == ["big"]
    engine.release("big")
    assert admitted(engine.run_cycle(3.0).decisions) == ["small"]


def test_higher_priority_goes_first_within_a_queue() -> None:
    engine = engine_of(a_queue("q").nominal(gpu=2).build())
    engine.submit(a_job("early-low").queue("q").priority(1).gpus(2).at(0.0).build())
    engine.submit(a_job("late-high").queue("q").priority(5).gpus(2).at(9.0).build())
    assert admitted(engine.run_cycle(10.0).decisions) == ["late-high"]


def _fair_pair(weight_b: float = 1.0, half_life: float = 0.0) -> QueueingEngine:
    return engine_of(
        a_queue("a").cohort("c").nominal(gpu=4).build(),
        a_queue("b").cohort("c").nominal(gpu=4).weight(weight_b).build(),
        a_queue("idle").cohort("c").nominal(gpu=4).build(),
        fair=FairSharing(enabled=True, usage_half_life_s=half_life),
    )


def test_fair_share_admits_the_queue_with_the_lower_dominant_share_first() -> None:
    engine = _fair_pair()
    engine.submit(a_job("a-running").queue("a").gpus(6).at(0.0).build())
    engine.run_cycle(0.0)
    # Both want the last 6 GPUs; a was first in time but already holds more of the cohort.
    engine.submit(a_job("a-more").queue("a").gpus(6).at(1.0).build())
    engine.submit(a_job("b-first").queue("b").gpus(6).at(2.0).build())
    result = engine.run_cycle(3.0)
    assert admitted(result.decisions) == ["b-first"]
    assert result.waits["a-more"] is WaitReason.QUOTA_EXHAUSTED


def test_fair_share_interleaves_queues_within_one_cycle() -> None:
    engine = _fair_pair()
    for i in range(4):
        engine.submit(a_job(f"a{i}").queue("a").gpus(1).at(float(i)).build())
        engine.submit(a_job(f"b{i}").queue("b").gpus(1).at(float(10 + i)).build())
    order = admitted(engine.run_cycle(20.0).decisions)
    assert order == ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3"]


def test_fair_share_weights_favour_the_heavier_queue() -> None:
    engine = _fair_pair(weight_b=2.0)
    engine.submit(a_job("a-running").queue("a").gpus(3).at(0.0).build())
    engine.submit(a_job("b-running").queue("b").gpus(4).at(0.0).build())
    engine.run_cycle(0.0)
    engine.submit(a_job("a-next").queue("a").gpus(5).at(1.0).build())
    engine.submit(a_job("b-next").queue("b").gpus(5).at(2.0).build())
    # share(a) = 3/12 = 0.25 > share(b) = (4/12)/2 = 0.17: b goes first despite holding more.
    assert admitted(engine.run_cycle(3.0).decisions) == ["b-next"]


def test_fair_share_remembers_past_usage_with_a_half_life() -> None:
    engine = _fair_pair(half_life=60.0)
    engine.run_cycle(0.0)
    engine.submit(a_job("a-hog").queue("a").gpus(12).at(0.0).build())
    engine.run_cycle(0.0)
    engine.run_cycle(600.0)  # a held the whole cohort for ten half-lives
    engine.release("a-hog")
    engine.submit(a_job("a-again").queue("a").gpus(12).at(601.0).build())
    engine.submit(a_job("b-new").queue("b").gpus(12).at(602.0).build())
    # a uses nothing now, but its history still counts against it.
    assert admitted(engine.run_cycle(601.0).decisions) == ["b-new"]
    history = engine.fair_share.history("a")[("a100", "gpu")]
    assert 11.9 < history <= 12.0


def test_fair_share_history_decays_away() -> None:
    engine = _fair_pair(half_life=10.0)
    engine.run_cycle(0.0)
    engine.submit(a_job("a-hog").queue("a").gpus(12).build())
    engine.run_cycle(0.0)
    engine.run_cycle(10.0)  # one half-life at full usage: history = 6
    assert engine.fair_share.history("a")[("a100", "gpu")] == pytest.approx(6.0)
    engine.release("a-hog")
    engine.run_cycle(10.0)  # usage is observed as each cycle leaves it
    engine.run_cycle(20.0)  # one half-life idle: history halves
    assert engine.fair_share.history("a")[("a100", "gpu")] == pytest.approx(3.0)


def test_topology_aware_admission_holds_a_gang_the_free_shape_cannot_place() -> None:
    """8 GPUs free in quota, but as 1 per node: an 8-GPU pod cannot land anywhere."""
    engine = engine_of(a_queue("q").nominal(gpu=16).build())
    scattered = FreeShapeOracle([NodeFree(f"n{i}", "a100", free_gpus=1) for i in range(8)])
    engine.submit(a_job("one-by-eight").queue("q").gpus(8).at(0.0).build())
    engine.submit(a_job("eight-by-one").queue("q").gpus(1, pods=8).at(1.0).build())
    result = engine.run_cycle(0.0, oracle=scattered)
    assert admitted(result.decisions) == ["eight-by-one"]
    [wait] = [d for d in result.decisions if isinstance(d, Wait)]
    assert (wait.job, wait.reason) == ("one-by-eight", WaitReason.NO_FEASIBLE_PLACEMENT)
    # The held job takes no quota meanwhile.
    assert engine.queue_usage("q")[("a100", "gpu")] == 8
    whole_node = FreeShapeOracle([NodeFree("big", "a100", free_gpus=8)])
    assert admitted(engine.run_cycle(1.0, oracle=whole_node).decisions) == ["one-by-eight"]


def test_shape_reserved_by_one_admission_is_not_offered_to_the_next() -> None:
    engine = engine_of(a_queue("q").nominal(gpu=16).build())
    oracle = FreeShapeOracle([NodeFree("n0", "a100", free_gpus=8), NodeFree("n1", "a100", free_gpus=4)])
    for i in range(3):
        engine.submit(a_job(f"j{i}").queue("q").gpus(4, pods=2).at(float(i)).build())
    result = engine.run_cycle(0.0, oracle=oracle)
    assert admitted(result.decisions) == ["j0"]
    assert result.waits == {"j1": WaitReason.NO_FEASIBLE_PLACEMENT, "j2": WaitReason.NO_FEASIBLE_PLACEMENT}
    assert oracle.free_gpus("n0") + oracle.free_gpus("n1") == 4


def test_fractional_and_mig_requests_are_accounted_in_their_own_resources() -> None:
    engine = engine_of(a_queue("q").nominal(gpu_milli=1000, mig={"1g.10gb": 3}, flavor="a100").build())
    engine.submit(a_job("half-1").queue("q").milli(500).at(0.0).build())
    engine.submit(a_job("half-2").queue("q").milli(500).at(1.0).build())
    engine.submit(a_job("half-3").queue("q").milli(500).at(2.0).build())
    engine.submit(a_job("slices").queue("q").mig("1g.10gb", pods=3).at(3.0).build())
    result = engine.run_cycle(0.0)
    assert admitted(result.decisions) == ["half-1", "half-2", "slices"]
    assert result.waits == {"half-3": WaitReason.QUOTA_EXHAUSTED}
    assert dict(engine.queue_usage("q")) == {("a100", "gpu-milli"): 1000, ("a100", "mig-1g.10gb"): 3}


def test_greedy_flavor_choice_that_strands_a_later_group_waits_with_no_matching_flavor() -> None:
    """Flavors are chosen group by group without backtracking, as Kueue does: the first group
    takes a100, and the second, allowed only a100, can then never fit there."""
    engine = engine_of(a_queue("q").nominal(gpu=4, flavor="a100").nominal(gpu=4, flavor="t4").build())
    job = a_job("split").queue("q").gpus(3, group="any").flavors("a100").gpus(3, group="a100-only").build()
    engine.submit(job)
    result = engine.run_cycle(0.0)
    assert result.waits == {"split": WaitReason.NO_MATCHING_FLAVOR}


def test_a_cycle_evaluates_each_job_at_most_once_and_skips_repeats_that_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tessera.admission.domain.queueing import cycle
    from tessera.admission.domain.queueing.flavors import assign_flavors as real

    calls = 0

    def counting(*args: object) -> object:
        nonlocal calls
        calls += 1
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(cycle, "assign_flavors", counting)
    engine = engine_of(*(a_queue(f"q{i}").nominal(gpu=10).build() for i in range(10)))
    for i in range(2000):
        engine.submit(a_job(f"j{i}").queue(f"q{i % 10}").gpus(1 + (i // 10) % 2).at(float(i)).build())
    result = engine.run_cycle(0.0)
    assert result.examined == 2000
    assert result.admitted == 10 * 7  # per queue: 1+2+1+2+1+2 = 9, then a 1 fits, a 2 does not
    # Admissions, plus one evaluation per queue for each distinct request shape that failed.
    assert calls <= result.admitted + 10 * 2
