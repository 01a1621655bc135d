"""In-flight preemption records stay consistent with their victims: a victim that released (even if
admitted again since) drops out of its preemptor's record, a victim another preemptor still waits for
keeps draining when the preemptor that asked for it is cancelled, and no record can make the cycle
fail (which would stop every admission in every queue)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest

from tessera.admission.domain.model import JobState
from tessera.admission.domain.queueing import (
    Admit,
    InFlightPreemption,
    Preempt,
    PreemptionReason,
    PreemptionTiming,
    QueueingConfig,
    QueueingEngine,
    QueueingValidationError,
    QueueSpec,
    WaitReason,
)
from tessera.admission.domain.queueing.builders import a_job as a_workload
from tessera.admission.domain.queueing.builders import a_queue
from tessera.admission.domain.queueing.model import DrainingVictim
from tessera.admission.service_layer import cycle_state
from tessera.admission.service_layer.cycle import run_cycle
from tessera.admission.service_layer.handlers import cancel_job, report_outcome, submit_job
from tessera.contracts.events import PreemptionRequested
from tessera.testing.builders import a_job

EIGHT = {
    "flavors": [{"name": "a100"}],
    "queues": [{"name": "team-q", "quotas": [{"flavor": "a100", "resources": {"gpu": 8}}]}],
    "tenant_queues": [{"tenant": "team", "queue": "team-q"}],
}

# qv borrows qa's A100s and has H100s of its own; qa reclaims its A100s.
TWO_FLAVORS = {
    "flavors": [{"name": "a100"}, {"name": "h100"}],
    "cohorts": [{"name": "shared"}],
    "queues": [
        {"name": "qa", "cohort": "shared", "quotas": [{"flavor": "a100", "resources": {"gpu": 8}}]},
        {
            "name": "qv",
            "cohort": "shared",
            "quotas": [
                {"flavor": "a100", "resources": {"gpu": 0}},
                {"flavor": "h100", "resources": {"gpu": 4}},
            ],
        },
    ],
    "tenant_queues": [{"tenant": "ta", "queue": "qa"}, {"tenant": "tv", "queue": "qv"}],
}


async def submit(uow: Any, job_id: str, gpus: int, tenant: str = "team", priority: int = 0) -> None:
    spec = a_job(job_id).tenant(tenant).priority(priority).group(gpus=gpus).as_dict()
    async with uow:
        result = await submit_job(spec, uow, job_id)
        await uow.commit()
    assert result.state is JobState.QUEUED, result.errors


async def cycle(uow: Any, now: Any = None) -> Any:
    async with uow:
        return await run_cycle(uow, now=now)


async def report(uow: Any, job_id: str, outcome: str) -> None:
    async with uow:
        await report_outcome(job_id, outcome, "", uow)
        await uow.commit()


def records(uow: Any) -> tuple[list[tuple[str, tuple[str, ...]]], list[tuple[str, str]]]:
    cycle_records = uow.fake_cycle_records
    return (
        [(r.preemptor, r.victims) for r in cycle_records.inflight],
        [(d.victim, d.preemptor) for d in cycle_records.draining],
    )


# ---- through the service -----------------------------------------------------------------------


async def test_a_victim_admitted_again_elsewhere_is_not_waited_for_nor_forced_out(uow: Any) -> None:
    uow.configure(TWO_FLAVORS)
    await submit(uow, "h", 4, tenant="tv")
    await cycle(uow)
    await submit(uow, "v", 4, tenant="tv")
    await submit(uow, "w", 4, tenant="tv")
    await cycle(uow)
    assert [uow.job(j).flavors for j in ("h", "v", "w")] == [("a100",), ("a100",), ("h100",)]
    await submit(uow, "a", 8, tenant="ta")
    report_ = await cycle(uow)
    assert sorted(report_.preemptions) == ["h", "v"]
    deadline = uow.events_of(PreemptionRequested)[-1].deadline

    await report(uow, "v", "preempted")  # v leaves at once and queues again; h is slow
    await report(uow, "w", "succeeded")  # the H100s free up: v is admitted there
    report_ = await cycle(uow)
    assert report_.admitted == ["v"] and uow.job("v").flavors == ("h100",)
    assert records(uow) == ([("a", ("h",))], [("h", "a")])
    assert uow.job("a").waiting == (WaitReason.WAITING_FOR_VICTIMS.value, "waiting for h")

    await report(uow, "h", "preempted")
    report_ = await cycle(uow)
    assert report_.admitted == ["a"]  # no need to wait for the deadline: every victim has gone
    assert records(uow) == ([], [])

    report_ = await cycle(uow, now=deadline + timedelta(seconds=1))
    assert report_.released == [] and uow.job("v").state is JobState.ADMITTED


async def test_a_cancelled_preemptors_victim_still_drains_for_the_preemptor_waiting_on_it(uow: Any) -> None:
    uow.configure(EIGHT)
    await submit(uow, "v", 8)
    await cycle(uow)
    await submit(uow, "a", 4, priority=100)
    await submit(uow, "b", 4, priority=100)
    report_ = await cycle(uow)
    assert report_.preemptions == ["v"]
    assert records(uow) == ([("a", ("v",)), ("b", ("v",))], [("v", "a")])
    (asked,) = uow.events_of(PreemptionRequested)
    async with uow:
        await cancel_job("a", uow)
        await uow.commit()

    report_ = await cycle(uow)
    assert report_.admitted == [] and report_.released == []
    assert records(uow) == ([("b", ("v",))], [("v", "a")])
    assert uow.job("b").waiting == (WaitReason.WAITING_FOR_VICTIMS.value, "waiting for v")

    report_ = await cycle(uow, now=asked.deadline + timedelta(seconds=1))
    assert report_.released == ["v"] and report_.admitted == ["b"]
    forced = uow.events_of(PreemptionRequested)[-1]
    assert (forced.victim_job_id, forced.preemptor_job_id, forced.forced) == ("v", "a", True)
    assert records(uow) == ([], [])


async def test_a_record_that_no_longer_fits_is_dropped_and_the_cycle_admits_the_rest(
    uow: Any, caplog: pytest.LogCaptureFixture
) -> None:
    uow.configure(EIGHT)
    await submit(uow, "x", 4)
    await submit(uow, "y", 4)
    # A record naming a flavor the configuration no longer has.
    uow.fake_cycle_records.inflight = [InFlightPreemption("x", (), 0.0, 1.0, ("gone",), {("gone", "gpu"): 4})]
    with caplog.at_level(logging.WARNING, logger=cycle_state.log.name):
        report_ = await cycle(uow)
    assert sorted(report_.admitted) == ["x", "y"]
    (dropped,) = [r for r in caplog.records if r.getMessage().startswith("in-flight preemption dropped")]
    assert "unknown flavor 'gone'" in dropped.getMessage()
    assert records(uow) == ([], [])


# ---- the engine --------------------------------------------------------------------------------

TIMING = PreemptionTiming(checkpoint_grace_s=120.0, default_grace_s=30.0, release_timeout_s=60.0)


def engine_of(*queues: QueueSpec) -> QueueingEngine:
    return QueueingEngine(QueueingConfig.build(flavors=["a100", "h100"], queues=queues, timing=TIMING))


def two_flavor_engine() -> QueueingEngine:
    return engine_of(
        a_queue("qa").cohort("shared").nominal(gpu=8, flavor="a100").build(),
        a_queue("qv").cohort("shared").nominal(gpu=0, flavor="a100").nominal(gpu=4, flavor="h100").build(),
    )


def test_a_released_victim_admitted_again_leaves_the_record_at_once() -> None:
    engine = two_flavor_engine()
    engine.submit(a_workload("h").queue("qv").gpus(4).at(0.0).build())
    engine.submit(a_workload("v").queue("qv").gpus(4).at(1.0).build())
    engine.submit(a_workload("w").queue("qv").gpus(4).at(2.0).build())
    engine.run_cycle(0.0)
    engine.submit(a_workload("a").queue("qa").gpus(8).at(3.0).build())
    assert sorted(p.victim for p in engine.run_cycle(1.0).decisions if isinstance(p, Preempt)) == ["h", "v"]
    v = engine.admitted("v").workload
    engine.release("v")
    engine.release("w")
    engine.submit(v)
    decisions = engine.run_cycle(2.0).decisions
    assert [(d.job, d.flavors) for d in decisions if isinstance(d, Admit)] == [("v", ("h100",))]
    record = engine.inflight("a")
    assert record is not None and record.victims == ("h",)
    engine.release("h")
    assert [d.job for d in engine.run_cycle(3.0).decisions if isinstance(d, Admit)] == ["a"]
    assert engine.is_admitted("v") and not engine.is_draining("v")


def test_a_restored_record_keeps_only_victims_admitted_before_it_and_still_asked_to_leave() -> None:
    engine = engine_of(a_queue("q").nominal(gpu=8).build())
    old = a_workload("old").queue("q").gpus(4).build()
    again = a_workload("again").queue("q").gpus(2).build()
    quiet = a_workload("quiet").queue("q").gpus(2).build()
    engine.restore_admitted(old, ("a100",), 0.0)
    engine.restore_admitted(again, ("a100",), 20.0)  # released and admitted again after the request
    engine.restore_admitted(quiet, ("a100",), 0.0)  # admitted before, but nobody asks it to leave
    engine.submit(a_workload("p").queue("q").gpus(4).priority(9).at(5.0).build())
    asked = {
        n: DrainingVictim(n, "p", PreemptionReason.WITHIN_QUEUE_PRIORITY, 100.0)
        for n in ("old", "again", "gone")
    }
    record = InFlightPreemption(
        "p", ("old", "again", "quiet", "gone"), 10.0, 100.0, ("a100",), {("a100", "gpu"): 4}
    )
    engine.restore_preemption(record, asked)
    restored = engine.inflight("p")
    assert restored is not None and restored.victims == ("old",)
    assert engine.is_draining("old") and not engine.is_draining("again") and not engine.is_draining("quiet")
    result = engine.run_cycle(200.0)  # past the deadline: only "old" is forced out
    assert [(d.victim, d.forced) for d in result.decisions if isinstance(d, Preempt)] == [("old", True)]
    assert [d.job for d in result.decisions if isinstance(d, Admit)] == ["p"]


@pytest.mark.parametrize(
    ("record", "field"),
    [
        pytest.param(InFlightPreemption("nobody", (), 0.0, 1.0, ("a100",), {}), "preemptor", id="not queued"),
        pytest.param(
            InFlightPreemption("p", (), 0.0, 1.0, ("a100", "a100"), {}), "flavors", id="flavor count"
        ),
        pytest.param(InFlightPreemption("p", (), 0.0, 1.0, ("t4",), {}), "flavors", id="unknown flavor"),
    ],
)
def test_a_record_that_does_not_fit_is_refused_naming_the_field(
    record: InFlightPreemption, field: str
) -> None:
    engine = engine_of(a_queue("q").nominal(gpu=8).build())
    engine.submit(a_workload("p").queue("q").gpus(4).build())
    with pytest.raises(QueueingValidationError) as refused:
        engine.restore_preemption(record, {})
    assert refused.value.field == field
    assert engine.inflight("p") is None and engine.queue_usage("q").get(("a100", "gpu"), 0) == 0


def test_cancelling_a_preemptor_lets_its_victim_stay_unless_another_waits_for_it() -> None:
    engine = engine_of(a_queue("q").nominal(gpu=8).build())
    engine.submit(a_workload("v").queue("q").gpus(8).build())
    engine.run_cycle(0.0)
    engine.submit(a_workload("a").queue("q").gpus(4).priority(9).at(1.0).build())
    engine.submit(a_workload("b").queue("q").gpus(4).priority(9).at(2.0).build())
    engine.run_cycle(1.0)
    waiting = engine.inflight("b")
    assert waiting is not None and waiting.victims == ("v",)
    engine.cancel("a")
    assert engine.is_draining("v")  # b still waits for it
    engine.cancel("b")
    assert not engine.is_draining("v") and not engine.admitted("v").being_preempted
    # Nothing counts v as leaving any more: a new preemptor asks it again.
    engine.submit(a_workload("c").queue("q").gpus(4).priority(9).at(3.0).build())
    result = engine.run_cycle(3.0)
    assert [(d.victim, d.preemptor) for d in result.decisions if isinstance(d, Preempt)] == [("v", "c")]
