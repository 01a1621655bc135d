"""Handlers `(envelope, uow)`: telemetry samples and application metrics become observations of series;
telemetry's inventory names each GPU's shape."""

from __future__ import annotations

import math

from tessera.contracts.events import GpuSample, InventoryChanged, RecordMetric
from tessera.core.messaging.consumer import Handler
from tessera.core.messaging.envelope import Envelope
from tessera.forecaster.domain.model import Series
from tessera.forecaster.domain.series import GPU_BUSY, Aggregation, SeriesKey, bucket
from tessera.forecaster.service_layer.dependencies import ForecasterDeps
from tessera.forecaster.service_layer.unit_of_work import ForecasterUnitOfWork

UNKNOWN_SHAPE = "unknown"


async def _series(
    deps: ForecasterDeps,
    uow: ForecasterUnitOfWork,
    key: SeriesKey,
    aggregation: Aggregation,
    gpu_shape: str | None,
) -> Series:
    known = deps.known_series.get(str(key)) or await uow.series.find(key)
    if known is not None:  # committed before: safe to remember (a new one may yet be rolled back)
        deps.known_series[str(key)] = known
        return known
    return await uow.series.get_or_add(key, deps.step_s, aggregation, gpu_shape)


def on_gpu_sample(deps: ForecasterDeps) -> Handler[ForecasterUnitOfWork]:
    """A GPU's reading adds its utilisation (as a share of one GPU) to its shape's `gpu_busy` series; a
    step's value is the sum over GPUs of each one's mean."""

    async def handle(envelope: Envelope, uow: ForecasterUnitOfWork) -> None:
        sample = GpuSample.model_validate(envelope.data)
        shape = await uow.gpus.shape(sample.gpu_uuid) or UNKNOWN_SHAPE
        s = await _series(deps, uow, SeriesKey.of(GPU_BUSY, {"shape": shape}), "mean", shape)
        step = bucket(sample.at, s.step_s)
        await uow.observations.add(s.id, step, sample.gpu_uuid, sample.utilization_pct / 100.0)

    return handle


def on_record_metric(deps: ForecasterDeps) -> Handler[ForecasterUnitOfWork]:
    """An application's reading of its own metric (a CloudEvent on `tessera.forecaster.cmd.record_metric`)."""

    async def handle(envelope: Envelope, uow: ForecasterUnitOfWork) -> None:
        metric = RecordMetric.model_validate(envelope.data)
        if not math.isfinite(metric.value):
            return  # kept out: the series' checks would only see a gap
        s = await _series(
            deps, uow, SeriesKey.of(metric.metric, metric.labels), metric.aggregation, metric.gpu_shape
        )
        await uow.observations.add(s.id, bucket(metric.at, s.step_s), "", metric.value)

    return handle


def on_inventory_changed(deps: ForecasterDeps) -> Handler[ForecasterUnitOfWork]:
    async def handle(envelope: Envelope, uow: ForecasterUnitOfWork) -> None:
        inventory = InventoryChanged.model_validate(envelope.data)
        for node in inventory.nodes:
            for gpu in node.gpus:
                await uow.gpus.note(gpu.uuid, gpu.model, node.name)

    return handle
