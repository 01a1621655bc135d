"""The forecaster records every GPU sample it consumes, whole, and keeps them a day unless told otherwise."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tessera.contracts import subjects
from tessera.contracts.events import GpuSample
from tessera.core.db.retention import RetentionRule
from tessera.core.recording.model import ObservedEvent
from tessera.forecaster import bootstrap
from tessera.forecaster.adapters import orm
from tessera.forecaster.config import ForecasterSettings
from tessera.forecaster.service_layer.unit_of_work import ForecasterUnitOfWork
from tessera.testing.builders import an_envelope
from tessera.testing.fakes import FakeRecordingUnitOfWork


class FakeForecasterUnitOfWork(FakeRecordingUnitOfWork, ForecasterUnitOfWork):
    pass


SAMPLE = GpuSample(
    node="gpu-node-0",
    gpu_index=3,
    gpu_uuid="GPU-3",
    at=datetime(2026, 11, 23, 3, 0, tzinfo=UTC),
    utilization_pct=87.5,
    memory_used_mib=40960,
    power_w=310.0,
    temperature_c=64.0,
)


async def test_a_gpu_sample_is_recorded_as_it_arrived_and_nothing_is_published() -> None:
    (samples,) = bootstrap.consumers()
    assert (samples.stream_owner, samples.filter_subject) == ("telemetry", subjects.ALL_GPU_SAMPLES)
    envelope = an_envelope(SAMPLE, source="tessera/telemetry/gpu-node-0")
    uow = FakeForecasterUnitOfWork()
    async with uow:
        await samples.handler(envelope, uow)
        await uow.commit()
    assert uow.recorded == [
        ObservedEvent(
            event_id=envelope.id,
            type=GpuSample.TYPE,
            subject="GPU-3",
            source="tessera/telemetry/gpu-node-0",
            occurred_at=envelope.time,
            data=SAMPLE.model_dump(mode="json"),
        )
    ]
    assert uow.outbox == []


async def test_a_sample_whose_unit_is_rolled_back_is_not_kept() -> None:
    (samples,) = bootstrap.consumers()
    uow = FakeForecasterUnitOfWork()
    async with uow:
        await samples.handler(an_envelope(SAMPLE), uow)
    assert uow.recorded == []


@pytest.mark.parametrize(("configured", "kept_h"), [({}, 24.0), ({"observed_retention_h": 2}, 2.0)])
def test_samples_are_kept_for_the_configured_hours(
    monkeypatch: pytest.MonkeyPatch, configured: dict[str, float], kept_h: float
) -> None:
    monkeypatch.delenv("TESSERA_FORECASTER_OBSERVED_RETENTION_H", raising=False)
    definition = bootstrap.build(ForecasterSettings.model_validate(configured))
    assert definition.retention == [RetentionRule(orm.observed_events, "received_at", kept_h * 3600)]
