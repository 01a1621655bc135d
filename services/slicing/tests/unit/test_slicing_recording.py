"""Slicing records the scheduler's events and the inventory it consumes, and keeps them a week; pods'
measured use is kept for the usage window only."""

from __future__ import annotations

import pytest

from tessera.contracts import subjects
from tessera.contracts.base import Message
from tessera.contracts.events import DemandChanged, GpuDemand, GpuInventory, InventoryChanged, NodeInventory
from tessera.core.db.retention import RetentionRule
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.slicing import bootstrap
from tessera.slicing.adapters import orm
from tessera.slicing.config import SlicingSettings
from tessera.slicing.service_layer.unit_of_work import SlicingUnitOfWork
from tessera.testing.builders import an_envelope
from tessera.testing.fakes import FakeRecordingUnitOfWork


class FakeSlicingUnitOfWork(FakeRecordingUnitOfWork, SlicingUnitOfWork):
    pass


DEMAND = DemandChanged(pending_gangs=2, demand=[GpuDemand(gpus=1, milli=1000, pods=4)])
INVENTORY = InventoryChanged(
    source="telemetry/gpu-node-0",
    nodes=[
        NodeInventory(
            name="gpu-node-0",
            cpu_milli=64000,
            memory_mib=524288,
            gpus=[GpuInventory(index=0, uuid="GPU-0", model="A100-80GB", memory_mib=81920)],
        )
    ],
)


def test_slicing_listens_to_the_scheduler_inventory_idle_gpus_pod_use_forecasts_and_released_jobs() -> None:
    assert [(c.name, c.stream_owner, c.filter_subject) for c in bootstrap.consumers()] == [
        ("slicing-scheduler-events", "scheduler", "tessera.scheduler.evt.>"),
        ("slicing-inventory", "telemetry", subjects.INVENTORY_CHANGED),
        ("slicing-gpu-idle", "telemetry", subjects.GPU_IDLE),
        ("slicing-pod-usage", "telemetry", subjects.ALL_POD_GPU_USAGE),
        ("slicing-forecasts", "forecaster", subjects.FORECAST_UPDATED),
        ("slicing-ready-for-eviction", "checkpoint", subjects.READY_FOR_EVICTION),
    ]


async def test_each_consumer_records_what_it_receives_in_order() -> None:
    scheduler_events, inventory, *_ = bootstrap.consumers()
    uow = FakeSlicingUnitOfWork()
    arrivals: list[tuple[Message, ConsumerSpec[SlicingUnitOfWork]]] = [
        (DEMAND, scheduler_events),
        (INVENTORY, inventory),
    ]
    envelopes = []
    for message, consumer in arrivals:
        envelope = an_envelope(message)
        envelopes.append(envelope)
        async with uow:
            await consumer.handler(envelope, uow)
            await uow.commit()
    assert [(e.event_id, e.type, e.data) for e in uow.recorded] == [
        (envelopes[0].id, DemandChanged.TYPE, DEMAND.model_dump(mode="json")),
        (envelopes[1].id, InventoryChanged.TYPE, INVENTORY.model_dump(mode="json")),
    ]
    assert uow.recorded[0].subject == "cluster" and uow.outbox == []


def test_observed_events_are_kept_a_week_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TESSERA_SLICING_OBSERVED_RETENTION_H", raising=False)
    definition = bootstrap.build(SlicingSettings(kubeconfig=None))
    assert definition.retention == [
        RetentionRule(orm.observed_events, "received_at", 7 * 24 * 3600),
        RetentionRule(orm.pod_usage, "minute", 361 * 60.0),  # the usage window and the minute being written
    ]
    assert definition.background == []  # without a cluster, demand is only recorded
