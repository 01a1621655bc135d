"""Admission's handlers on in-memory repositories (`conftest.py`): what each does to the jobs, what
it announces once committed, and what it refuses. No database, no NATS."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tessera.admission.bootstrap import consumers
from tessera.admission.domain.documents import QueueingDocument
from tessera.admission.domain.model import InvalidTransition, JobCheckpoint, JobState
from tessera.admission.domain.queueing import QueueingValidationError
from tessera.admission.entrypoints.tenant_submit import handle_tenant_submit
from tessera.admission.service_layer.configuration import change_config
from tessera.admission.service_layer.cycle import run_cycle
from tessera.admission.service_layer.handlers import (
    JobNotFound,
    cancel_job,
    handle_checkpoint_saved,
    handle_inventory,
    handle_outcome_command,
    handle_scheduler_event,
    handle_submit_command,
    report_outcome,
    submit_job,
)
from tessera.contracts import subjects
from tessera.contracts.base import Message
from tessera.contracts.events import (
    CheckpointSaved,
    GangFinished,
    GangPlaced,
    GangUnschedulable,
    GpuAssignment,
    GpuInventory,
    InventoryChanged,
    JobAccepted,
    JobFinished,
    JobRejected,
    JobStateChanged,
    NodeInventory,
    PodPlacement,
    PodsEvicted,
    ReportJobOutcome,
    SubmitJob,
    checkpoint_id,
)
from tessera.core.messaging.consumer import PermanentError
from tessera.testing.builders import a_job, an_envelope

TEAM: dict[str, Any] = {
    "flavors": [{"name": "a100"}],
    "queues": [
        {"name": "team-q", "quotas": [{"flavor": "a100", "resources": {"gpu": 8}}]},
        {"name": "other-q", "quotas": [{"flavor": "a100", "resources": {"gpu": 8}}]},
    ],
    "tenant_queues": [{"tenant": "team", "queue": "team-q"}, {"tenant": "other", "queue": "other-q"}],
}
TEAM_DOC = QueueingDocument.model_validate(TEAM)


async def deliver(handler: Any, message: Message, uow: Any) -> None:
    """As the consumer does: one unit of work per message, committed."""
    async with uow:
        await handler(an_envelope(message), uow)
        await uow.commit()


async def submitted(uow: Any, job_id: str, spec: dict[str, Any] | None = None) -> None:
    async with uow:
        result = await submit_job(spec or a_job(job_id).as_dict(), uow, job_id)
        await uow.commit()
    assert result.state is JobState.QUEUED, result.errors


async def admitted(uow: Any, job_id: str) -> None:
    """Queued, then admitted by a cycle (open mode: no queue configured, no inventory)."""
    await submitted(uow, job_id)
    async with uow:
        report = await run_cycle(uow)
    assert job_id in report.admitted


def placed(job_id: str, *nodes: str) -> GangPlaced:
    return GangPlaced(
        job_id=job_id,
        placements=[
            PodPlacement(
                pod=f"{job_id}-{i}",
                group="workers",
                node=node,
                gpus=[GpuAssignment(index=0, uuid=f"GPU-{i}", milli=1000)],
            )
            for i, node in enumerate(nodes)
        ],
    )


async def placed_job(uow: Any, job_id: str) -> None:
    await admitted(uow, job_id)
    await deliver(handle_scheduler_event, placed(job_id, "gpu-1"), uow)
    assert uow.job(job_id).state is JobState.PLACED


def changes(uow: Any, job_id: str) -> list[tuple[str | None, str, str]]:
    return [
        (e.previous_state, e.state, e.reason) for e in uow.events_of(JobStateChanged) if e.job_id == job_id
    ]


# ---- submit ----------------------------------------------------------------------------------------


async def test_a_valid_job_is_queued_stored_and_announced_when_committed(uow: Any) -> None:
    command = SubmitJob(
        job_id="train-1", spec=a_job("train").tenant("team").group(replicas=2, gpus=4).as_dict()
    )
    await deliver(handle_submit_command, command, uow)
    job = uow.job("train-1")
    assert (job.state, job.queue, job.tenant) == (JobState.QUEUED, "default", "team")
    assert uow.fake_jobs.workloads["train-1"]["groups"][0]["count"] == 2
    assert uow.events_of(JobAccepted) == [
        JobAccepted(job_id="train-1", name="train", tenant="team", queue="default")
    ]
    assert changes(uow, "train-1") == [("submitted", "queued", "accepted into queue default")]
    assert uow.fake_gate.mark == 1, "a cycle runs next"


async def test_an_invalid_job_is_rejected_and_the_rejection_names_the_field(uow: Any) -> None:
    spec = a_job("Not_A_Label").as_dict()
    await deliver(handle_submit_command, SubmitJob(job_id="bad-1", spec=spec), uow)
    job = uow.job("bad-1")
    assert job.state is JobState.REJECTED
    (rejected,) = uow.events_of(JobRejected)
    assert [e.field for e in rejected.errors] == ["name"]
    assert "name: must be a DNS label" in job.history[-1].reason
    assert "bad-1" not in uow.fake_jobs.workloads, "a rejected job never reaches the queues"


async def test_a_tenant_may_submit_only_to_its_own_queue(uow: Any) -> None:
    uow.configure(TEAM)
    async with uow:
        result = await submit_job(a_job("sneaky").tenant("team").queue("other-q").as_dict(), uow, "sneaky")
        await uow.commit()
    assert result.state is JobState.REJECTED
    assert [e.field for e in result.errors] == ["queue"]
    assert "may submit only to its own queue 'team-q'" in result.errors[0].reason
    (rejected,) = uow.events_of(JobRejected)
    assert rejected.errors == result.errors


async def test_a_configured_tenant_lands_in_its_queue(uow: Any) -> None:
    uow.configure(TEAM)
    await submitted(uow, "mine", a_job("mine").tenant("team").as_dict())
    assert uow.job("mine").queue == "team-q"


async def test_a_redelivered_submit_command_stores_one_job_and_announces_it_once(uow: Any) -> None:
    command = SubmitJob(spec=a_job("train").as_dict())  # no job id: the command's own id is used
    envelope = an_envelope(command)
    for _ in range(2):
        async with uow:
            await handle_submit_command(envelope, uow)
            await uow.commit()
    assert list(uow.fake_jobs.stored) == [envelope.id]
    assert len(uow.events_of(JobAccepted)) == 1
    async with uow:
        again = await submit_job(a_job("train").as_dict(), uow, envelope.id)
    assert again.duplicate and again.state is JobState.QUEUED


async def test_nothing_is_announced_unless_the_unit_of_work_commits(uow: Any) -> None:
    async with uow:
        await submit_job(a_job("train").as_dict(), uow, "train-1")
    assert uow.outbox == [] and uow.commits == 0


@pytest.mark.parametrize(
    "handler", [handle_submit_command, handle_outcome_command, handle_inventory], ids=lambda h: h.__name__
)
async def test_a_message_of_the_wrong_type_is_dead_lettered(uow: Any, handler: Any) -> None:
    wrong = PodsEvicted(job_id="j", pods=["p"], reason="node_lost")
    async with uow:
        with pytest.raises(PermanentError, match=PodsEvicted.TYPE):
            await handler(an_envelope(wrong), uow)


def test_each_handler_reads_the_subjects_it_is_meant_for() -> None:
    wired = {spec.name: (spec.stream_owner, spec.filter_subject, spec.handler) for spec in consumers(None)}  # type: ignore[arg-type]
    assert wired == {
        "admission-submit": ("admission", subjects.SUBMIT_JOB, handle_submit_command),
        "admission-outcomes": ("admission", subjects.REPORT_JOB_OUTCOME, handle_outcome_command),
        "admission-scheduler-outcomes": ("scheduler", "tessera.scheduler.evt.>", handle_scheduler_event),
        "admission-inventory": ("telemetry", subjects.INVENTORY_CHANGED, handle_inventory),
        "admission-checkpoints": ("checkpoint", subjects.CHECKPOINT_SAVED, handle_checkpoint_saved),
        "admission-tenant-submit": ("admission", subjects.ALL_TENANT_SUBMITS, handle_tenant_submit),
    }


# ---- outcome reports -------------------------------------------------------------------------------


async def test_a_placed_job_reported_running_runs(uow: Any) -> None:
    await placed_job(uow, "j1")
    await deliver(handle_outcome_command, ReportJobOutcome(job_id="j1", state="running"), uow)
    assert uow.job("j1").state is JobState.RUNNING
    assert changes(uow, "j1")[-1] == ("placed", "running", "running")
    assert "j1" in uow.fake_inventory.placements, "a running job keeps its GPUs"
    assert not uow.events_of(JobFinished)


async def test_a_job_that_succeeds_finishes_and_frees_its_gpus(uow: Any) -> None:
    await placed_job(uow, "j1")
    await deliver(handle_outcome_command, ReportJobOutcome(job_id="j1", state="running"), uow)
    await deliver(
        handle_outcome_command, ReportJobOutcome(job_id="j1", state="succeeded", reason="exit 0"), uow
    )
    assert uow.job("j1").state is JobState.SUCCEEDED
    (finished,) = uow.events_of(JobFinished)
    assert (finished.job_id, finished.state, finished.reason) == ("j1", "succeeded", "exit 0")
    assert "j1" not in uow.fake_inventory.placements


async def test_a_release_after_a_preemption_request_names_the_preemptor(uow: Any) -> None:
    await placed_job(uow, "victim")
    uow.job("victim").preempted_by = "urgent"  # a cycle asked it to give its quota to `urgent`
    await deliver(
        handle_outcome_command,
        ReportJobOutcome(job_id="victim", state="preempted", reason="2 pods evicted"),
        uow,
    )
    job = uow.job("victim")
    assert [(t.state, t.reason) for t in job.history[-2:]] == [
        (JobState.PREEMPTED, "released after preemption by urgent: 2 pods evicted"),
        (JobState.QUEUED, "requeued after preemption"),
    ]
    assert [(e.state, e.reason) for e in uow.events_of(JobFinished)] == [
        ("preempted", "released after preemption by urgent: 2 pods evicted")
    ]
    assert "victim" not in uow.fake_inventory.placements, "its GPUs are free"


async def test_an_outcome_that_does_not_fit_the_state_is_ignored(uow: Any) -> None:
    await submitted(uow, "queued")
    before = len(uow.outbox)
    await deliver(handle_outcome_command, ReportJobOutcome(job_id="queued", state="succeeded"), uow)
    assert uow.job("queued").state is JobState.QUEUED
    assert len(uow.outbox) == before
    async with uow:
        assert await report_outcome("queued", "running", "", uow) is None


async def test_an_unknown_outcome_or_job_changes_nothing(uow: Any) -> None:
    await placed_job(uow, "j1")
    before, saves = len(uow.outbox), uow.fake_jobs.saves
    await deliver(handle_outcome_command, ReportJobOutcome(job_id="j1", state="exploded"), uow)
    await deliver(handle_outcome_command, ReportJobOutcome(job_id="nobody", state="running"), uow)
    assert (len(uow.outbox), uow.fake_jobs.saves) == (before, saves)
    async with uow:
        with pytest.raises(QueueingValidationError) as raised:
            await report_outcome("j1", "exploded", "", uow)
    assert raised.value.field == "state"


# ---- the scheduler's news --------------------------------------------------------------------------


async def test_a_placed_gang_places_its_job_and_records_its_gpus(uow: Any) -> None:
    await admitted(uow, "j1")
    await deliver(handle_scheduler_event, placed("j1", "gpu-2", "gpu-1", "gpu-2"), uow)
    job = uow.job("j1")
    assert job.state is JobState.PLACED
    assert job.history[-1].reason == "placed 3 pods on gpu-1, gpu-2"
    assert [p["node"] for p in uow.fake_inventory.placements["j1"]] == ["gpu-2", "gpu-1", "gpu-2"]
    assert changes(uow, "j1")[-1][:2] == ("admitted", "placed")


async def test_a_placement_for_a_job_not_admitted_is_ignored(uow: Any) -> None:
    await submitted(uow, "queued")
    await deliver(handle_scheduler_event, placed("queued", "gpu-1"), uow)
    assert uow.job("queued").state is JobState.QUEUED
    assert uow.fake_inventory.placements == {}


async def test_an_unschedulable_gang_keeps_its_quota_and_says_why(uow: Any) -> None:
    await admitted(uow, "j1")
    await deliver(handle_scheduler_event, GangUnschedulable(job_id="j1", message="0/4 nodes fit"), uow)
    assert uow.job("j1").state is JobState.ADMITTED
    assert changes(uow, "j1")[-1] == ("admitted", "admitted", "unschedulable: 0/4 nodes fit")


async def test_unschedulable_news_of_a_placed_job_is_ignored(uow: Any) -> None:
    await placed_job(uow, "j1")
    before = len(uow.outbox)
    await deliver(handle_scheduler_event, GangUnschedulable(job_id="j1", message="late"), uow)
    assert uow.job("j1").state is JobState.PLACED and len(uow.outbox) == before


@pytest.mark.parametrize(("succeeded", "final"), [(True, JobState.SUCCEEDED), (False, JobState.FAILED)])
async def test_a_finished_gang_ends_its_job_and_names_each_pods_phase(
    uow: Any, succeeded: bool, final: JobState
) -> None:
    await placed_job(uow, "j1")
    pods = {"j1-1": "Succeeded", "j1-0": "Succeeded" if succeeded else "Failed"}
    await deliver(handle_scheduler_event, GangFinished(job_id="j1", succeeded=succeeded, pods=pods), uow)
    job = uow.job("j1")
    assert job.state is final
    reason = f"every pod ended: j1-0 {pods['j1-0']}, j1-1 Succeeded"
    assert job.history[-1].reason == reason
    assert [(e.state, e.reason) for e in uow.events_of(JobFinished)] == [(final.value, reason)]
    assert "j1" not in uow.fake_inventory.placements


async def test_evicted_pods_leave_the_job_as_it_is(uow: Any) -> None:
    await placed_job(uow, "j1")
    before = len(uow.outbox)
    await deliver(handle_scheduler_event, PodsEvicted(job_id="j1", pods=["j1-0"], reason="node_lost"), uow)
    assert uow.job("j1").state is JobState.PLACED and len(uow.outbox) == before


# ---- inventory -------------------------------------------------------------------------------------


def inventory(source: str, *nodes: str) -> InventoryChanged:
    gpu = GpuInventory(index=0, uuid="GPU-0", model="A100-80GB", memory_mib=81920)
    return InventoryChanged(
        source=source,
        nodes=[NodeInventory(name=n, cpu_milli=64000, memory_mib=512000, gpus=[gpu]) for n in nodes],
    )


async def test_each_source_reports_its_whole_inventory(uow: Any) -> None:
    await deliver(handle_inventory, inventory("rack-a", "a-1", "a-2"), uow)
    await deliver(handle_inventory, inventory("rack-b", "b-1"), uow)
    await deliver(handle_inventory, inventory("rack-a", "a-2", "a-3"), uow)
    async with uow:
        nodes = dict(await uow.inventory.nodes())
    assert sorted(nodes) == ["a-2", "a-3", "b-1"], "a-1 left rack-a's report; rack-b's nodes stay"
    assert nodes["a-3"][0]["model"] == "A100-80GB"
    assert uow.fake_gate.mark == 3 and uow.fake_gate.holds == 3


# ---- cancel, configuration, tokens -----------------------------------------------------------------


async def test_a_cancelled_job_finishes_and_cannot_be_cancelled_twice(uow: Any) -> None:
    await admitted(uow, "j1")
    async with uow:
        job = await cancel_job("j1", uow)
        await uow.commit()
    assert job.state is uow.job("j1").state is JobState.CANCELLED
    assert [(e.job_id, e.state) for e in uow.events_of(JobFinished)] == [("j1", "cancelled")]
    async with uow:
        with pytest.raises(InvalidTransition, match="cannot move from cancelled to cancelled"):
            await cancel_job("j1", uow)
        with pytest.raises(JobNotFound):
            await cancel_job("nobody", uow)


async def test_a_configuration_that_does_not_check_out_is_refused_naming_the_field(uow: Any) -> None:
    uow.configure(TEAM)
    before = uow.fake_config.stored
    broken = {"queues": [{"name": "team-q", "quotas": [{"flavor": "h100", "resources": {"gpu": 8}}]}]}
    async with uow:
        with pytest.raises(QueueingValidationError) as raised:
            await change_config(uow, lambda cfg: cfg.merged(QueueingDocument.model_validate(broken)))
    assert "flavor" in raised.value.field
    assert uow.fake_config.stored == before and uow.fake_gate.mark == 0


async def test_a_configuration_change_is_saved_and_wakes_the_cycle(uow: Any) -> None:
    async with uow:
        after = await change_config(uow, lambda cfg: cfg.merged(TEAM_DOC))
        await uow.commit()
    assert (
        [q.name for q in uow.fake_config.stored.queues]
        == ["team-q", "other-q"]
        == [q.name for q in after.queues]
    )
    assert uow.fake_gate.mark == 1


# ---- checkpoints -----------------------------------------------------------------------------------

SAVED_AT = datetime(2026, 11, 25, 9, 30, tzinfo=UTC)


def saved(job_id: str, step: int, uri: str, at: datetime = SAVED_AT, request_id: str | None = None) -> Any:
    return CheckpointSaved(job_id=job_id, request_id=request_id, step=step, uri=uri, size_bytes=2**20, at=at)


async def test_a_saved_checkpoint_is_recorded_once_and_told_in_the_job_s_history(uow: Any) -> None:
    await placed_job(uow, "train")
    uri = "file:///ckpt/train/step-40-ab"
    await deliver(handle_checkpoint_saved, saved("train", 40, uri, request_id="req-1"), uow)
    # Announced again (another event id, so the inbox lets it through): the same checkpoint.
    await deliver(handle_checkpoint_saved, saved("train", 40, uri, request_id="req-1"), uow)

    job = uow.job("train")
    assert [t.reason for t in job.history if t.reason.startswith("checkpoint")] == [
        f"checkpoint saved at step 40 ({uri})"
    ]
    assert job.state is JobState.PLACED and changes(uow, "train")[-1] == (
        "placed",
        "placed",
        f"checkpoint saved at step 40 ({uri})",
    )
    expected = JobCheckpoint(checkpoint_id("train", uri), 40, 2**20, uri, SAVED_AT)
    assert uow.fake_checkpoints.by_job == {"train": [(expected, "req-1")]}
    assert job.latest_checkpoint == expected


async def test_the_newest_checkpoint_is_the_one_the_job_resumes_from_whatever_the_order_told(
    uow: Any,
) -> None:
    await placed_job(uow, "train")
    later = saved("train", 90, "file:///ckpt/train/step-90-b", SAVED_AT + timedelta(minutes=5))
    await deliver(handle_checkpoint_saved, later, uow)
    await deliver(handle_checkpoint_saved, saved("train", 40, "file:///ckpt/train/step-40-a"), uow)

    latest = uow.job("train").latest_checkpoint
    assert latest is not None and (latest.step, latest.uri) == (90, "file:///ckpt/train/step-90-b")
    async with uow:
        listed = await uow.checkpoints.of_jobs(["train"])
    assert [c.step for c in listed["train"]] == [90, 40], "newest first"


async def test_a_checkpoint_of_a_job_admission_does_not_know_is_dropped(uow: Any) -> None:
    await deliver(handle_checkpoint_saved, saved("stranger", 3, "file:///ckpt/stranger/step-3-x"), uow)
    assert uow.fake_checkpoints.by_job == {} and uow.outbox == []


async def test_the_checkpoint_consumer_takes_only_checkpoint_saved(uow: Any) -> None:
    with pytest.raises(PermanentError, match="admission-checkpoints takes"):
        async with uow:
            await handle_checkpoint_saved(an_envelope(SubmitJob(spec={})), uow)
