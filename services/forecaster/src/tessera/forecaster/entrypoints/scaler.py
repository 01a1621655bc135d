"""KEDA's external scaler over gRPC (`externalscaler.ExternalScaler`), answering from precomputed forecasts.

A ScaledObject's `external` trigger carries the scaler metadata the PredictiveAutoscaler controller
writes: `predictiveAutoscaler` (its name), `metric` (a series metric, or `gpuUtilization`), `selector`
(`k=v,...` over series labels), `target` (the value one replica handles) and `windowSeconds`. A request
sees only what the ScaledObject's namespace may (`ScaledObjectRef.namespace`, which KEDA sets; see the
external metrics API's module): a metric no series of it has answers NOT_FOUND, whether there is none or
it is another namespace's, and so does an autoscaler named `<namespace>/<name>` in another namespace.
Metadata without the autoscaler's name or metric answers INVALID_ARGUMENT."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from tessera.core.waits import wait_any
from tessera.forecaster.adapters.externalscaler import externalscaler_pb2 as pb
from tessera.forecaster.adapters.externalscaler import externalscaler_pb2_grpc as pb_grpc
from tessera.forecaster.entrypoints.api import namespaced_metric_value
from tessera.forecaster.service_layer.dependencies import ForecasterDeps
from tessera.forecaster.service_layer.metric_names import MetricRef, parse_selector
from tessera.forecaster.service_layer.queries import MetricValue

log = logging.getLogger(__name__)
AUTOSCALER = "predictiveAutoscaler"


@dataclass(frozen=True)
class ScalerRequest:
    autoscaler: str
    ref: MetricRef
    target: float
    namespace: str = ""
    """the ScaledObject's namespace: the series it may read are its own and the cluster's"""

    @property
    def foreign_autoscaler(self) -> bool:
        """Whether the autoscaler is named as another namespace's (`<namespace>/<name>`)."""
        owner, sep, _ = self.autoscaler.rpartition("/")
        return bool(sep) and owner != self.namespace

    @property
    def metric_name(self) -> str:
        """The metric KEDA puts on its HPA: one per autoscaler, in the characters HPA metric names allow."""
        return re.sub(r"[^a-z0-9-]", "-", f"tessera-{self.autoscaler}".lower())[:63]


class BadMetadata(ValueError):
    pass


def parse_metadata(
    metadata: Mapping[str, str], default_window_s: float, namespace: str = ""
) -> ScalerRequest:
    autoscaler, metric = metadata.get(AUTOSCALER, ""), metadata.get("metric", "")
    if not autoscaler or not metric:
        raise BadMetadata(f"scalerMetadata must name {AUTOSCALER!r} and 'metric'")
    try:
        selector = parse_selector(metadata.get("selector", ""))
        target = float(metadata.get("target", "1"))
        if "windowSeconds" in metadata:
            selector["window"] = str(float(metadata["windowSeconds"]))
    except ValueError as exc:
        raise BadMetadata(str(exc)) from exc
    if not math.isfinite(target) or target <= 0:
        raise BadMetadata("target must be a positive number")
    ref = MetricRef.from_selector(metric, selector, default_window_s)
    return ScalerRequest(autoscaler, ref, target, namespace)


class ExternalScaler(pb_grpc.ExternalScalerServicer):  # type: ignore[misc]
    def __init__(self, deps: ForecasterDeps, stream_poll_s: float = 1.0) -> None:
        self.deps = deps
        self.stream_poll_s = stream_poll_s

    async def _request(self, ref: pb.ScaledObjectRef, context: grpc.aio.ServicerContext) -> ScalerRequest:
        try:
            return parse_metadata(dict(ref.scalerMetadata), self.deps.default_window_s, ref.namespace)
        except BadMetadata as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise

    async def _value(self, request: ScalerRequest, context: grpc.aio.ServicerContext | None) -> MetricValue:
        if request.foreign_autoscaler:  # served nothing, as an autoscaler that does not exist
            value = MetricValue(request.ref.series_metric, 0.0, 0.0, "reactive", "no_series", (), ())
        else:
            async with self.deps.uow() as uow:
                value = await namespaced_metric_value(
                    uow, request.namespace, request.ref, now=self.deps.clock()
                )
        if not value.found and context is not None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"PredictiveAutoscaler {request.autoscaler}: no series of metric {request.ref.series_metric!r}"
                f" in namespace {request.namespace!r}",
            )
        return value

    async def IsActive(
        self, ref: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.IsActiveResponse:
        value = await self._value(await self._request(ref, context), context)
        return pb.IsActiveResponse(result=value.value > 0)

    async def StreamIsActive(
        self, ref: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.IsActiveResponse]:
        """Sends the state at once, then each time the served value crosses zero and back."""
        request = await self._request(ref, context)
        last: bool | None = None
        while not self.deps.stop.is_set():
            try:
                value = await self._value(request, None)
            except Exception as exc:  # the database may be restarting: keep the stream, try again
                log.warning("scaler stream read failed", extra={"error": repr(exc)})
            else:
                active = value.value > 0
                if active != last:
                    last = active
                    yield pb.IsActiveResponse(result=active)
            self.deps.round_done.clear()
            await wait_any(self.deps.stop, self.deps.round_done, timeout=self.stream_poll_s)

    async def GetMetricSpec(
        self, ref: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricSpecResponse:
        request = await self._request(ref, context)
        await self._value(request, context)  # an unknown metric is NOT_FOUND here too
        spec = pb.MetricSpec(
            metricName=request.metric_name,
            targetSize=max(1, math.ceil(request.target)),
            targetSizeFloat=request.target,
        )
        return pb.GetMetricSpecResponse(metricSpecs=[spec])

    async def GetMetrics(
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricsResponse:
        parsed = await self._request(request.scaledObjectRef, context)
        value = await self._value(parsed, context)
        name = request.metricName or parsed.metric_name
        return pb.GetMetricsResponse(
            metricValues=[
                pb.MetricValue(
                    metricName=name, metricValue=math.ceil(value.value), metricValueFloat=value.value
                )
            ]
        )


async def start_scaler(deps: ForecasterDeps, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    pb_grpc.add_ExternalScalerServicer_to_server(ExternalScaler(deps), server)  # type: ignore[no-untyped-call]
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return server, bound


def scaler_task(host: str, port: int) -> Callable[[ForecasterDeps], Coroutine[Any, Any, None]]:
    """The background task serving the scaler until the service stops."""

    async def serve_keda_scaler(deps: ForecasterDeps) -> None:
        server, bound = await start_scaler(deps, host, port)
        deps.scaler_port = bound
        log.info("keda external scaler listening", extra={"port": bound})
        try:
            await deps.stop.wait()
        finally:
            await server.stop(grace=1.0)

    return serve_keda_scaler


__all__ = ["ExternalScaler", "parse_metadata", "scaler_task", "start_scaler"]
