"""The forecaster on real NATS and Postgres: record_metric commands become a series, a round forecasts
it and KEDA's scaler serves it; a restarted forecaster serves the forecast it stored, and falls back to the
last reading, saying why, once that forecast no longer reaches now."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime, timedelta

import grpc
import nats
import pytest

from tessera.contracts import subjects
from tessera.contracts.events import ForecastUpdated, RecordMetric
from tessera.core.db.migrations import migrate
from tessera.core.messaging.envelope import encode
from tessera.forecaster import bootstrap
from tessera.forecaster.adapters.externalscaler import externalscaler_pb2 as pb
from tessera.forecaster.adapters.externalscaler import externalscaler_pb2_grpc as pb_grpc
from tessera.forecaster.config import ForecasterSettings
from tessera.forecaster.domain.series import SeriesKey
from tessera.forecaster.service_layer.forecasting import forecast_round
from tessera.forecaster.service_layer.queries import metric_value
from tessera.testing.services import eventually, read_stream, reset_jetstream, running, settings_for

pytestmark = pytest.mark.integration

REF = pb.ScaledObjectRef(
    name="chat",
    namespace="serving",
    scalerMetadata={"predictiveAutoscaler": "chat", "metric": "requests_per_s", "selector": "app=chat"},
)


async def served(port: int) -> pb.MetricValue:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalScalerStub(channel)  # type: ignore[no-untyped-call]
        response = await stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=REF, metricName="tessera-chat"))
        return response.metricValues[0]


async def test_a_restarted_forecaster_serves_its_stored_forecast_then_falls_back_saying_why(
    nats_url: str, fresh_database: str
) -> None:
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate, "forecaster", fresh_database)
    settings = settings_for(
        ForecasterSettings, nats_url, fresh_database, grpc_host="127.0.0.1", grpc_port=0, refit_every_steps=5
    )
    now = datetime.now(UTC)
    last_minute = now.replace(second=0, microsecond=0) - timedelta(minutes=1)
    async with running(bootstrap.build(settings), settings) as first:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        for i in range(180):  # three hours of a daily-ish wave, one reading a minute
            at = last_minute - timedelta(minutes=179 - i)
            value = 50.0 + 30.0 * math.sin(i / 20) + (i % 7)
            command = RecordMetric(
                metric="requests_per_s", labels={"app": "chat"}, value=value, at=at, gpu_shape="A100-80GB"
            )
            subject, headers, body = encode(command, "tessera/test")
            await js.publish(subject, body, headers=headers)

        async def stored() -> bool:
            async with first.deps.uow() as uow:
                s = await uow.series.find(SeriesKey.of("requests_per_s", {"app": "chat"}))
                if s is None:
                    return False
                return len(await uow.observations.points(s, now - timedelta(hours=4))) == 180

        await eventually(stored, timeout=30)
        assert await forecast_round(first.deps) == 1
        before = await served(first.deps.scaler_port)
        assert before.metricValueFloat > 0
        updated = await read_stream(js, subjects.FORECAST_UPDATED)
        (shape,) = ForecastUpdated.model_validate(updated[-1].data).demand
        assert (shape.shape, shape.source) == ("A100-80GB", "forecast")
        async with first.deps.uow() as uow:
            s = await uow.series.find(SeriesKey.of("requests_per_s", {"app": "chat"}))
            assert s is not None
            model = await uow.models.get(s.id)
            assert model is not None and model.chosen is not None and model.fit_seconds > 0
        await nc.close()

    async with running(bootstrap.build(settings), settings) as restarted:

        async def listening() -> bool:
            return restarted.deps.scaler_port is not None

        await eventually(listening, timeout=10)
        port = restarted.deps.scaler_port
        assert port is not None
        async with restarted.deps.uow() as uow:
            s = await uow.series.find(SeriesKey.of("requests_per_s", {"app": "chat"}))
            assert s is not None
            latest = await uow.forecasts.get(s.id)
            assert latest is not None and latest.forecast is not None  # the last good forecast survived
        after = await served(port)
        assert after.metricValueFloat > 0
        # half an hour later with no new readings: the stored forecast no longer reaches now
        restarted.deps.clock = lambda: now + timedelta(minutes=30)
        await forecast_round(restarted.deps)
        async with restarted.deps.uow() as uow:
            latest = await uow.forecasts.get(s.id)
            assert latest is not None and latest.degraded == "stale"
            assert latest.forecast is not None  # kept, though not served
        async with restarted.deps.uow() as uow:
            value = await metric_value(
                uow, "requests_per_s", {"app": "chat"}, now=restarted.deps.clock(), window_s=300
            )
        assert (value.source, value.reason) == ("reactive", "requests_per_s{app=chat}: stale")
        stale = await served(port)
        last_reading = 50.0 + 30.0 * math.sin(179 / 20) + (179 % 7)
        assert stale.metricValueFloat == pytest.approx(last_reading)
