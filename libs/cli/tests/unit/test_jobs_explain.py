"""Reading a job's history as a story with its latest decisions (`tessera jobs explain`)."""

from __future__ import annotations

from typing import Any

from tessera.cli.explain import explain, render


def job(state: str, *history: tuple[str, str, str], **more: Any) -> dict[str, Any]:
    return {
        "id": "job-1",
        "name": "train",
        "tenant": "team",
        "queue": "team-q",
        "priority": 0,
        "state": state,
        "submitted_at": "2026-01-01T00:00:00Z",
        "history": [{"state": s, "reason": r, "at": f"2026-01-01T00:{at}Z"} for at, s, r in history],
        **more,
    }


SUBMITTED = ("00:00", "submitted", "submitted")
QUEUED = ("00:00", "queued", "accepted into queue team-q")
WAITED = ("00:01", "queued", "waiting: QuotaExhausted: no unused quota and no preemptible victims")
ADMITTED = ("00:05", "admitted", "admitted to queue team-q in flavor a100")
UNSCHEDULABLE = ("00:06", "admitted", "unschedulable: insufficient GPU on 3 nodes; unhealthy GPU on 1")
PLACED = ("00:09", "placed", "placed 2 pods on gpu-node-0, gpu-node-1")
RUNNING = ("00:10", "running", "all 2 pods running")


def test_a_placed_job_names_both_sides_decisions_and_waits_for_nothing() -> None:
    found = explain(job("running", SUBMITTED, QUEUED, WAITED, ADMITTED, UNSCHEDULABLE, PLACED, RUNNING))
    assert [s.kind for s in found.story] == [
        "submitted",
        "queued",
        "waiting",
        "admitted",
        "unschedulable",
        "placed",
        "running",
    ]
    assert [s.after_s for s in found.story] == [0.0, 0.0, 1.0, 5.0, 6.0, 9.0, 10.0]
    assert (found.admission.decision, found.admission.reason) == (
        "admitted",
        "admitted to queue team-q in flavor a100",
    )
    assert found.scheduler is not None
    assert (found.scheduler.decision, found.scheduler.reason) == (
        "placed",
        "placed 2 pods on gpu-node-0, gpu-node-1",
    )
    assert (found.waiting, found.hint) == (False, None)
    lines = render(found)
    assert lines[0] == "train (job-1)  tenant team, queue team-q, priority 0"
    assert lines[1] == "state: running (since +10.0s after submission)"
    assert "      +1.0s  waiting        QuotaExhausted: no unused quota and no preemptible victims" in lines
    assert "      +6.0s  unschedulable  insufficient GPU on 3 nodes; unhealthy GPU on 1" in lines
    assert "  scheduler  placed: placed 2 pods on gpu-node-0, gpu-node-1" in lines


def test_an_admitted_job_the_scheduler_cannot_place_waits_for_room() -> None:
    found = explain(job("admitted", SUBMITTED, QUEUED, ADMITTED, UNSCHEDULABLE))
    assert found.scheduler is not None and found.scheduler.decision == "unschedulable"
    assert found.scheduler.reason == "insufficient GPU on 3 nodes; unhealthy GPU on 1"
    assert found.waiting and found.hint is not None and "no room for the whole gang" in found.hint


def test_a_requeued_job_is_told_from_its_latest_queueing() -> None:
    preempted = ("00:20", "admitted", "preemption requested by urgent (InQueuePriority); grace 30s")
    released = ("00:30", "preempted", "released after preemption by urgent")
    requeued = ("00:31", "queued", "requeued after preemption")
    blocked = ("00:32", "queued", "waiting: BlockedByHead: strict FIFO: behind job-0")
    found = explain(
        job("queued", SUBMITTED, QUEUED, WAITED, ADMITTED, preempted, released, requeued, blocked)
    )
    assert [s.kind for s in found.story][-4:] == ["preemption_requested", "preempted", "queued", "waiting"]
    assert (found.admission.decision, found.admission.reason) == (
        "waiting",
        "BlockedByHead: strict FIFO: behind job-0",
    )
    assert found.hint == "queue team-q is strict FIFO and a job ahead of it cannot be admitted yet"


def test_a_queued_job_no_cycle_saw_yet_says_so() -> None:
    found = explain(job("queued", SUBMITTED, QUEUED))
    assert (
        found.admission.decision == "queued" and found.hint is not None and "no admission cycle" in found.hint
    )


def test_a_rejected_job_lists_its_errors() -> None:
    rejected = ("00:00", "rejected", "rejected: name: must be a DNS label")
    errors = [{"field": "name", "reason": "must be a DNS label"}]
    found = explain(job("rejected", SUBMITTED, rejected, errors=errors))
    assert found.admission.decision == "rejected" and found.scheduler is None and not found.waiting
    assert "  error      name: must be a DNS label" in render(found)
    assert found.to_json()["errors"] == errors


def test_the_newest_checkpoint_is_shown() -> None:
    checkpoint = {"id": "c1", "step": 1200, "bytes": 1, "uri": "file:///c/1", "at": "2026-01-01T00:10:00Z"}
    found = explain(job("running", SUBMITTED, QUEUED, ADMITTED, PLACED, RUNNING, checkpoints=[checkpoint]))
    assert found.checkpoint == checkpoint
    assert "  checkpoint step 1200 at 2026-01-01T00:10:00Z (file:///c/1)" in render(found)
