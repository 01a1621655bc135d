"""Wiring of the forecaster service: samples, inventory and application metrics in; a forecasting round
every step; forecasts served over HTTP (the Kubernetes external metrics API) and gRPC (KEDA's external
scaler)."""

from __future__ import annotations

from tessera.cluster.kube import api_client
from tessera.cluster.leader_settings import leader_elector
from tessera.contracts import subjects
from tessera.core.db.retention import RetentionRule
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.runner import ServiceContext, ServiceDefinition, serve
from tessera.forecaster.adapters import orm
from tessera.forecaster.adapters.models import default_candidates
from tessera.forecaster.config import ForecasterSettings, get_settings
from tessera.forecaster.domain.checks import InputPolicy
from tessera.forecaster.entrypoints.api import router
from tessera.forecaster.entrypoints.autoscalers import autoscaler_task
from tessera.forecaster.entrypoints.leading import leader_work
from tessera.forecaster.entrypoints.loops import forecast_every_step, warm_models
from tessera.forecaster.entrypoints.metrics_server import check_certificate, https_metrics
from tessera.forecaster.entrypoints.scaler import scaler_task
from tessera.forecaster.service_layer import handlers as on
from tessera.forecaster.service_layer.dependencies import ForecasterDeps
from tessera.forecaster.service_layer.engine import EngineConfig
from tessera.forecaster.service_layer.unit_of_work import ForecasterUnitOfWork

CONSUMERS = [
    ("gpu-samples", "telemetry", subjects.ALL_GPU_SAMPLES, on.on_gpu_sample),
    ("inventory", "telemetry", subjects.INVENTORY_CHANGED, on.on_inventory_changed),
    ("metrics", "forecaster", subjects.RECORD_METRIC, on.on_record_metric),
]


def consumers(deps: ForecasterDeps) -> list[ConsumerSpec[ForecasterUnitOfWork]]:
    return [
        ConsumerSpec(f"forecaster-{name}", owner, subject, on(deps)) for name, owner, subject, on in CONSUMERS
    ]


def engine_config(settings: ForecasterSettings) -> EngineConfig:
    history_steps = round(settings.history_h * 3600 / settings.step_s)
    return EngineConfig(
        horizon=max(settings.horizon_steps, settings.window_steps),
        window_steps=settings.window_steps,
        refit_every_steps=settings.refit_every_steps,
        train_steps=min(720, history_steps),
        margin_q=settings.margin_q,
        margin_window=settings.margin_window,
        blend=settings.blend_last_value,
        inputs=InputPolicy(min_history=settings.min_history_steps),
    )


def build(settings: ForecasterSettings) -> ServiceDefinition[ForecasterDeps]:
    async def dependencies(ctx: ServiceContext) -> ForecasterDeps:
        leader = None
        if settings.kubeconfig is not None:
            api = api_client(kubeconfig=str(settings.kubeconfig))
            leader = leader_elector(api, settings.leader_election, "default")
        return ForecasterDeps(
            uow=ctx.uow,
            stop=ctx.stop,
            step_s=settings.step_s,
            engine=engine_config(settings),
            candidates=lambda: default_candidates(settings.season_steps, settings.window_steps),
            history_s=settings.history_h * 3600,
            default_window_s=settings.default_window_s,
            leader=leader,
            tokens=settings.tokens(),
        )

    https = []
    if settings.metrics_tls.tls:  # the aggregation layer calls an APIService's backend over TLS only
        check_certificate(settings.metrics_tls)
        https.append(https_metrics(settings))
    return ServiceDefinition(
        name="forecaster",
        outbox=orm.outbox,
        inbox=orm.inbox,
        unit_of_work=ForecasterUnitOfWork,
        dependencies=dependencies,
        consumers=consumers,
        routers=[router],
        background=[
            leader_work(forecast_every_step, *([autoscaler_task(settings)] if settings.kubeconfig else [])),
            warm_models,
            scaler_task(settings.grpc_host, settings.grpc_port),
            *https,
        ],
        retention=[
            RetentionRule(orm.observations, "at", settings.observations_retention_h * 3600),
            RetentionRule(orm.forecast_errors, "origin_at", settings.errors_retention_h * 3600),
        ],
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
