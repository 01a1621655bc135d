"""Each scheduler handler as the consumer calls it, ``handler(envelope, uow)``, on the in-memory unit
of work: what it records, that it tells the loop only once the unit commits, and what it refuses."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tessera.contracts.base import Message
from tessera.contracts.events import (
    GpuInventory,
    GpuUnhealthy,
    InventoryChanged,
    JobAdmitted,
    JobFinished,
    NodeInventory,
    PreemptionRequested,
    ReadyForEviction,
)
from tessera.core.messaging.consumer import Handler, PermanentError
from tessera.core.observability.tracing import span_from_headers
from tessera.scheduler.service_layer import handlers
from tessera.scheduler.service_layer.handlers import SchedulingLoop
from tessera.scheduler.service_layer.repository_port import JOB, PlacementRow
from tessera.scheduler.service_layer.unit_of_work import SchedulerUnitOfWork
from tessera.testing.builders import a_job, an_envelope

# conftest's FakeSchedulerUnitOfWork (a conftest module cannot be imported).
FakeUnit = Any

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@dataclass
class RecordingLoop:
    """Stands in for the scheduling engine: counts what the handlers tell it."""

    wakes: int = 0
    unhealthy: list[tuple[str, int]] = field(default_factory=list)

    def wake(self) -> None:
        self.wakes += 1

    def gpu_unhealthy(self, node: str, index: int) -> None:
        self.unhealthy.append((node, index))

    @property
    def told(self) -> int:
        return self.wakes + len(self.unhealthy)


@pytest.fixture
def loop() -> RecordingLoop:
    return RecordingLoop()


def admitted(job_id: str = "job-1", *, priority: int = 0, at: datetime = T0) -> JobAdmitted:
    return JobAdmitted(job_id=job_id, spec=a_job(job_id).priority(priority).build(), submitted_at=at)


def node(name: str, *uuids: str) -> NodeInventory:
    gpus = [GpuInventory(index=i, uuid=u, model="A100-80GB", memory_mib=81920) for i, u in enumerate(uuids)]
    return NodeInventory(name=name, cpu_milli=64000, memory_mib=524288, gpus=gpus)


def unhealthy(node_name: str = "node-a", index: int = 1, uuid: str = "GPU-a1") -> GpuUnhealthy:
    return GpuUnhealthy(
        node=node_name, gpu_index=index, gpu_uuid=uuid, faults=["xid"], reasons=["xid 79"], at=T0
    )


def preemption(
    victim: str = "job-1", *, forced: bool = False, checkpointable: bool = True
) -> PreemptionRequested:
    return PreemptionRequested(
        victim_job_id=victim,
        preemptor_job_id="job-9",
        reason="InQueuePriority",
        deadline=T0 + timedelta(minutes=5),
        grace_period_s=30.5,
        checkpointable=checkpointable,
        forced=forced,
    )


def ready(
    victim: str = "job-1", preemptor: str | None = "job-9", reason: str = "checkpoint_saved"
) -> ReadyForEviction:
    saved = reason == "checkpoint_saved"
    return ReadyForEviction(
        job_id=victim,
        preemptor_job_id=preemptor,
        reason=reason,
        checkpoint_uri=f"file:///ckpt/{victim}/step-40" if saved else None,
        step=40 if saved else None,
        at=T0,
    )


def finished(job_id: str = "job-1", state: str = "cancelled") -> JobFinished:
    return JobFinished(job_id=job_id, state=state, reason="user asked", at=T0)


async def handle(
    handler: Handler[SchedulerUnitOfWork], message: Message, uow: FakeUnit, *, commit: bool = True
) -> None:
    """One message in one unit, as the consumer runs it (commit, or leave and roll back)."""
    async with uow:
        await handler(an_envelope(message), uow)
        if commit:
            await uow.commit()


# Every handler with a message it acts on.
ACTING = [
    pytest.param(handlers.job_admitted_handler, admitted(), id="job_admitted"),
    pytest.param(
        handlers.inventory_changed_handler, InventoryChanged(source="t", nodes=[node("t-1")]), id="inventory"
    ),
    pytest.param(handlers.gpu_unhealthy_handler, unhealthy(), id="gpu_unhealthy"),
    pytest.param(handlers.preemption_requested_handler, preemption(), id="preemption_requested"),
    pytest.param(handlers.job_finished_handler, finished(), id="job_finished"),
    pytest.param(handlers.ready_for_eviction_handler, ready("job-1"), id="ready_for_eviction"),
]
Factory = Callable[[SchedulingLoop], Handler[SchedulerUnitOfWork]]


# -- what every handler shares --------------------------------------------------------------------


@pytest.mark.parametrize(("factory", "message"), ACTING)
async def test_the_loop_hears_only_once_the_unit_has_committed(
    factory: Factory, message: Message, uow: FakeUnit, loop: RecordingLoop
) -> None:
    async with uow:
        await factory(loop)(an_envelope(message), uow)
        assert loop.told == 0, "told the loop before the commit: a cycle could miss what woke it"
        await uow.commit()

    assert loop.told == 1


@pytest.mark.parametrize(("factory", "message"), ACTING)
async def test_a_unit_rolled_back_keeps_nothing_and_tells_the_loop_nothing(
    factory: Factory, message: Message, uow: FakeUnit, loop: RecordingLoop
) -> None:
    await handle(handlers.inventory_changed_handler(RecordingLoop()), inventory_for_all(), uow)
    before = dataclasses.asdict(uow.stored)

    await handle(factory(loop), message, uow, commit=False)

    assert loop.told == 0
    assert dataclasses.asdict(uow.stored) == before


def inventory_for_all() -> InventoryChanged:
    """A stored inventory that every acting message above changes something in."""
    return InventoryChanged(source="other", nodes=[node("node-a", "GPU-a0", "GPU-a1")])


WRONG_TYPE = [
    pytest.param(handlers.job_admitted_handler, finished(), id="job_admitted"),
    pytest.param(handlers.inventory_changed_handler, unhealthy(), id="inventory"),
    pytest.param(handlers.gpu_unhealthy_handler, InventoryChanged(source="t", nodes=[]), id="gpu_unhealthy"),
    pytest.param(handlers.preemption_requested_handler, admitted(), id="preemption_requested"),
    pytest.param(handlers.job_finished_handler, preemption(), id="job_finished"),
]


@pytest.mark.parametrize(("factory", "message"), WRONG_TYPE)
async def test_a_message_of_another_type_is_dead_lettered(
    factory: Factory, message: Message, uow: FakeUnit, loop: RecordingLoop
) -> None:
    async with uow:
        with pytest.raises(PermanentError, match=message.TYPE):
            await factory(loop)(an_envelope(message), uow)
        await uow.commit()

    assert uow.stored.pending == {} and uow.stored.nodes == {} and uow.stored.preemptions == {}
    assert loop.told == 0


@pytest.mark.parametrize(("factory", "message"), ACTING)
async def test_a_body_that_fails_its_schema_is_dead_lettered(
    factory: Factory, message: Message, uow: FakeUnit, loop: RecordingLoop
) -> None:
    envelope = an_envelope(message)
    broken = dataclasses.replace(envelope, data={key: None for key in envelope.data})

    async with uow:
        with pytest.raises(PermanentError, match="does not match"):
            await factory(loop)(broken, uow)
        await uow.commit()

    assert loop.told == 0


# -- job_admitted ---------------------------------------------------------------------------------


async def test_an_admitted_job_is_queued_with_its_spec_priority_and_trace(
    uow: FakeUnit, loop: RecordingLoop
) -> None:
    message = admitted("job-1", priority=7)
    envelope = an_envelope(message, traceparent=TRACEPARENT)

    async with uow:
        with span_from_headers("handle", envelope.headers):  # the consumer's span
            await handlers.job_admitted_handler(loop)(envelope, uow)
        await uow.commit()

    row = uow.stored.pending["job-1"]
    assert (row.source, row.spec, row.priority, row.submitted_at) == (JOB, message.spec, 7, T0)
    assert row.trace["traceparent"].split("-")[1] == TRACEPARENT.split("-")[1]
    assert loop.wakes == 1


async def test_a_resumed_job_is_queued_with_the_checkpoint_it_resumes_from(
    uow: FakeUnit, loop: RecordingLoop
) -> None:
    uri = "file:///ckpt/job-1/step-40-ab12"
    await handle(
        handlers.job_admitted_handler(loop), admitted("job-1").model_copy(update={"resume_from": uri}), uow
    )
    await handle(handlers.job_admitted_handler(loop), admitted("job-2"), uow)

    assert uow.stored.pending["job-1"].resume_from == uri
    assert uow.stored.pending["job-2"].resume_from is None
    async with uow:
        assert [row.resume_from for row in await uow.repo.pending()] == [uri, None]


async def test_an_admitted_job_seen_again_is_queued_once_and_wakes_nobody(
    uow: FakeUnit, loop: RecordingLoop
) -> None:
    handle_admitted = handlers.job_admitted_handler(loop)
    await handle(handle_admitted, admitted("job-1", at=T0), uow)

    # Another delivery with its own event id: the inbox does not catch it, the repository does.
    await handle(handle_admitted, admitted("job-1", priority=3, at=T0 + timedelta(hours=1)), uow)

    assert list(uow.stored.pending) == ["job-1"]
    assert (uow.stored.pending["job-1"].submitted_at, uow.stored.pending["job-1"].priority) == (T0, 0)
    assert loop.wakes == 1


async def test_a_job_already_placed_is_not_queued_again(uow: FakeUnit, loop: RecordingLoop) -> None:
    async with uow:
        placed = PlacementRow("job-1", "default/job-1-0", "workers", "node-a", ((0, 1000),), 1000, 1024)
        await uow.repo.record_placements([placed])
        await uow.commit()

    await handle(handlers.job_admitted_handler(loop), admitted("job-1"), uow)

    assert uow.stored.pending == {}
    assert loop.wakes == 0


# -- inventory_changed ----------------------------------------------------------------------------


async def test_a_report_replaces_the_nodes_of_its_source_only(uow: FakeUnit, loop: RecordingLoop) -> None:
    handle_inventory = handlers.inventory_changed_handler(loop)
    await handle(
        handle_inventory, InventoryChanged(source="a", nodes=[node("a-1", "G1"), node("a-2", "G2")]), uow
    )
    await handle(handle_inventory, InventoryChanged(source="b", nodes=[node("b-1", "G3")]), uow)

    await handle(handle_inventory, InventoryChanged(source="a", nodes=[node("a-1", "G1", "G4")]), uow)

    assert {name: stored.source for name, stored in uow.stored.nodes.items()} == {"a-1": "a", "b-1": "b"}
    assert [gpu.uuid for gpu in uow.stored.nodes["a-1"].inventory.gpus] == ["G1", "G4"]
    assert loop.wakes == 3


# -- gpu_unhealthy --------------------------------------------------------------------------------


async def test_an_unhealthy_gpu_is_kept_in_the_inventory_and_the_loop_avoids_it(
    uow: FakeUnit, loop: RecordingLoop
) -> None:
    await handle(handlers.inventory_changed_handler(RecordingLoop()), inventory_for_all(), uow)

    await handle(handlers.gpu_unhealthy_handler(loop), unhealthy("node-a", 1, "GPU-a1"), uow)

    gpus = uow.stored.nodes["node-a"].inventory.gpus
    assert {gpu.uuid: gpu.healthy for gpu in gpus} == {"GPU-a0": True, "GPU-a1": False}
    assert loop.unhealthy == [("node-a", 1)]
    assert loop.wakes == 0


async def test_an_unhealthy_gpu_on_a_node_not_in_the_inventory_still_reaches_the_loop(
    uow: FakeUnit, loop: RecordingLoop
) -> None:
    """On a cluster the nodes come from the watches, not the stored inventory: the loop must hear."""
    await handle(handlers.gpu_unhealthy_handler(loop), unhealthy("watched-node", 3, "GPU-w3"), uow)

    assert uow.stored.nodes == {}
    assert loop.unhealthy == [("watched-node", 3)]


# -- preemption_requested -------------------------------------------------------------------------


async def test_a_preemption_request_is_recorded_for_the_loop(uow: FakeUnit, loop: RecordingLoop) -> None:
    await handle(handlers.preemption_requested_handler(loop), preemption("job-1"), uow)

    stored = uow.stored.preemptions["job-1"]
    assert (stored.preemptor_job_id, stored.reason, stored.deadline) == (
        "job-9",
        "InQueuePriority",
        T0 + timedelta(minutes=5),
    )
    assert (stored.grace_period_s, stored.checkpointable, stored.forced) == (30, True, False)
    assert loop.wakes == 1


async def test_a_repeated_preemption_request_replaces_the_earlier_one(
    uow: FakeUnit, loop: RecordingLoop
) -> None:
    handle_preemption = handlers.preemption_requested_handler(loop)
    await handle(handle_preemption, preemption("job-1"), uow)

    await handle(handle_preemption, preemption("job-1", forced=True), uow)

    assert list(uow.stored.preemptions) == ["job-1"]
    assert uow.stored.preemptions["job-1"].forced is True


# -- job_finished ---------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["succeeded", "failed", "cancelled"])
async def test_a_job_that_left_admission_is_withdrawn_at_once(
    state: str, uow: FakeUnit, loop: RecordingLoop
) -> None:
    await handle(handlers.job_finished_handler(loop), finished("job-1", state), uow)

    stored = uow.stored.preemptions["job-1"]
    assert (stored.preemptor_job_id, stored.reason, stored.deadline, stored.forced) == (
        "",
        f"job {state}: user asked",
        T0,
        True,
    )
    assert loop.wakes == 1


async def test_a_preempted_job_is_not_withdrawn_it_may_be_admitted_again(
    uow: FakeUnit, loop: RecordingLoop
) -> None:
    await handle(handlers.job_finished_handler(loop), finished("job-1", "preempted"), uow)

    assert uow.stored.preemptions == {}
    assert loop.wakes == 0


async def test_a_withdrawal_forces_an_earlier_preemption_request_and_keeps_its_preemptor(
    uow: FakeUnit, loop: RecordingLoop
) -> None:
    await handle(handlers.preemption_requested_handler(loop), preemption("job-1"), uow)

    await handle(handlers.job_finished_handler(loop), finished("job-1", "cancelled"), uow)

    stored = uow.stored.preemptions["job-1"]
    assert (stored.preemptor_job_id, stored.forced) == ("job-9", True)
    assert loop.wakes == 2


# -- ready_for_eviction ---------------------------------------------------------------------------


async def test_a_checkpointable_victim_waits_for_the_checkpoint_service_then_goes_with_its_checkpoint(
    uow: FakeUnit, loop: RecordingLoop
) -> None:
    await handle(handlers.preemption_requested_handler(loop), preemption("job-1"), uow)
    async with uow:
        assert await uow.repo.due_preemptions(T0.timestamp()) == []

    await handle(handlers.ready_for_eviction_handler(loop), ready("job-1"), uow)

    async with uow:
        (due,) = await uow.repo.due_preemptions(T0.timestamp())
    assert due.job_id == "job-1"
    assert due.ready == "checkpoint_saved at step 40 (file:///ckpt/job-1/step-40)"
    assert loop.wakes == 2


async def test_an_answer_to_another_preemption_of_the_same_job_releases_nothing(
    uow: FakeUnit, loop: RecordingLoop
) -> None:
    await handle(handlers.preemption_requested_handler(loop), preemption("job-1"), uow)
    await handle(handlers.ready_for_eviction_handler(loop), ready("job-1", preemptor="job-7"), uow)

    async with uow:
        assert await uow.repo.due_preemptions(T0.timestamp()) == []


async def test_a_node_termination_answer_needs_nothing_from_the_scheduler(
    uow: FakeUnit, loop: RecordingLoop
) -> None:
    await handle(handlers.ready_for_eviction_handler(loop), ready("job-1", preemptor=None), uow)

    assert uow.stored.ready == {} and loop.told == 0
