"""The conditions admission writes on a job's Jobs, and the numbers in a quota wait's message."""

from __future__ import annotations

from tessera.admission.domain.job_conditions import JobStatusView, conditions_for, merged
from tessera.admission.domain.model import JobState
from tessera.admission.domain.queueing import FlavorSpec, QueueingConfig, QueueingEngine
from tessera.admission.domain.queueing.builders import a_job, a_queue
from tessera.admission.domain.queueing.explain import quota_shortfall
from tessera.contracts.base import FieldError


def by_type(view: JobStatusView) -> dict[str, tuple[bool, str, str]]:
    return {c.type: (c.status, c.reason, c.message) for c in conditions_for(view)}


def test_a_waiting_job_says_why_with_its_queue_and_a_shape_no_node_holds_is_inadmissible() -> None:
    why = "queue q: needs 8 A100-80GB GPUs, 4 free in quota, borrowing limit reached; no preemptible victims"
    waiting = by_type(JobStatusView(JobState.QUEUED, "q", ("QuotaExhausted", why)))
    assert waiting["QuotaReserved"] == (False, "QuotaExhausted", why)
    assert waiting["Inadmissible"][0] is False
    shape = "no node shape holds a pod of 'w' (16 GPUs): the largest node, n1, has 8 x A100-80GB"
    never = by_type(JobStatusView(JobState.QUEUED, "q", ("NoFeasiblePlacement", shape)))
    assert never["Inadmissible"] == (True, "NoFeasiblePlacement", f"queue q: {shape}")
    busy = by_type(
        JobStatusView(JobState.QUEUED, "q", ("NoFeasiblePlacement", "the free GPUs cannot hold it"))
    )
    assert busy["Inadmissible"][0] is False, "free GPUs come back: not inadmissible"


def test_admitted_preempted_and_rejected_jobs() -> None:
    held = by_type(JobStatusView(JobState.RUNNING, "q", flavors=("a100-spot",)))
    assert held["QuotaReserved"] == (True, "QuotaReserved", "queue q: quota reserved in flavor a100-spot")
    assert held["Admitted"][0] is True and held["Preempted"][0] is False
    preempted = by_type(JobStatusView(JobState.PREEMPTED, "q", preempted_by="urgent"))
    assert preempted["Preempted"] == (
        True,
        "Preempted",
        "queue q: preempted by job urgent; suspended until it is admitted again",
    )
    lost = by_type(
        JobStatusView(
            JobState.REJECTED, "nope", errors=(FieldError(field="queue", reason="unknown queue 'nope'"),)
        )
    )
    assert lost["Inadmissible"] == (True, "QueueNotFound", "queue: unknown queue 'nope'")
    assert conditions_for(JobStatusView(JobState.SUCCEEDED, "q")) == (), "an ended job keeps its last ones"


def test_merging_keeps_others_conditions_and_moves_the_transition_time_only_on_a_new_status() -> None:
    controller = {"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": "Job suspended"}
    first = merged(
        [controller], conditions_for(JobStatusView(JobState.QUEUED, "q", ("QuotaExhausted", "a"))), "t1"
    )
    assert first is not None
    written, changed = first
    assert written[0] == controller and {c["type"] for c in written[1:]} == {
        "QuotaReserved",
        "Admitted",
        "Inadmissible",
    }
    assert len(changed) == 3
    again = conditions_for(JobStatusView(JobState.QUEUED, "q", ("QuotaExhausted", "b")))
    second = merged(written, again, "t2")
    assert second is not None
    after = {c["type"]: c for c in second[0]}
    assert after["QuotaReserved"]["lastTransitionTime"] == "t1", "still False: the transition stays"
    assert after["QuotaReserved"]["message"] == "queue q: b"
    assert [c.type for c in second[1]] == ["QuotaReserved", "Admitted"]
    assert merged(second[0], again, "t3") is None, "nothing new"


def test_the_shortfall_names_the_gpus_the_free_quota_and_the_borrowing_limit() -> None:
    team_a = a_queue("team-a").cohort("org").nominal("a100", gpu=4, borrowing_limit=0).build()
    team_b = a_queue("team-b").cohort("org").nominal("a100", gpu=4).build()
    config = QueueingConfig.build(flavors=[FlavorSpec("a100", "A100-80GB")], queues=[team_a, team_b])
    engine = QueueingEngine(config)
    engine.submit(a_job("holder").queue("team-a").gpus(4).build())
    engine.run_cycle(0.0)
    message = quota_shortfall(engine.tree, team_a, {("a100", "gpu"): 8}, config.flavor_specs)
    assert message == "queue team-a: needs 8 A100-80GB GPUs, 0 free in quota, borrowing limit reached"
    assert quota_shortfall(engine.tree, team_b, {("a100", "gpu"): 2}, config.flavor_specs) is None
