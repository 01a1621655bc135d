"""Wiring of the telemetry service."""

from __future__ import annotations

import socket
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.responses import Response

from tessera.contracts import subjects
from tessera.core.db.retention import RetentionRule
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.runner import ServiceContext, ServiceDefinition, serve
from tessera.telemetry.adapters import orm
from tessera.telemetry.adapters.processes import ProcessResolver
from tessera.telemetry.config import SourceKind, TelemetrySettings, get_settings
from tessera.telemetry.domain.attributed import Attributor
from tessera.telemetry.domain.health import HealthPolicy
from tessera.telemetry.domain.idle import IdlePolicy
from tessera.telemetry.domain.model import GpuSource
from tessera.telemetry.domain.monitor import Monitor
from tessera.telemetry.domain.rightsizing import RightsizingPolicy, RightsizingTracker
from tessera.telemetry.domain.usage import Accountant
from tessera.telemetry.domain.usage_rows import AccountingPolicy
from tessera.telemetry.entrypoints.logs import quiet_http_polls
from tessera.telemetry.entrypoints.publishers import announce_inventory, sample
from tessera.telemetry.entrypoints.usage_api import router as usage_router
from tessera.telemetry.service_layer import usage as on
from tessera.telemetry.service_layer.dependencies import Telemetry
from tessera.telemetry.service_layer.unit_of_work import TelemetryUnitOfWork
from tessera.telemetry.service_layer.usage import UsageLedger


def make_source(settings: TelemetrySettings) -> GpuSource:
    kind = settings.chosen_source()
    if kind is SourceKind.DEVCLUSTER:
        from tessera.telemetry.adapters.sources.devcluster import DevclusterSource

        assert settings.devcluster_url is not None  # checked by the settings
        return DevclusterSource(settings.devcluster_url)
    if kind is SourceKind.CLUSTER_FILE:
        from tessera.telemetry.adapters.cluster_file import ClusterFileSource

        assert settings.cluster_file is not None
        return ClusterFileSource(settings.cluster_file)
    if kind is SourceKind.DCGM:
        from tessera.telemetry.adapters.sources.dcgm import DcgmExporterSource

        assert settings.dcgm_url is not None
        return DcgmExporterSource(settings.dcgm_url, settings.node_name)
    from tessera.telemetry.adapters.sources.nvml import NvmlSource

    node = settings.node_name or socket.gethostname()
    return NvmlSource(node, resolver=make_process_resolver(settings, node))


def make_process_resolver(settings: TelemetrySettings, node: str) -> ProcessResolver | None:
    """Host pids to pods through the node's pods on the API server, when telemetry has a kubeconfig."""
    if settings.kubeconfig is None:
        return None
    from tessera.cluster.kube import api_client
    from tessera.telemetry.adapters.processes import KubeNodePods

    pods = KubeNodePods(api_client(kubeconfig=str(settings.kubeconfig)), node)
    return ProcessResolver(pods, settings.usage.proc_root)


def make_monitor(settings: TelemetrySettings) -> Monitor:
    # an idle stretch goes on through readings without a utilisation as long as usage bridges a gap
    max_unknown_s = max(settings.usage.max_gap_s, settings.sample_interval_s)
    return Monitor.with_policies(
        HealthPolicy(**settings.health.model_dump()),
        IdlePolicy(**settings.idle.model_dump(), max_unknown_s=max_unknown_s),
    )


def make_attributor(settings: TelemetrySettings, source: GpuSource) -> Attributor | None:
    """PodResources per node: the devcluster's per-node servers, else this node's kubelet socket."""
    from tessera.telemetry.adapters.attribution import PodResourcesAttributor

    endpoints = getattr(source, "podresources_endpoints", None)
    if endpoints is not None:
        return PodResourcesAttributor(endpoints)
    if settings.chosen_source() is SourceKind.CLUSTER_FILE:
        return None
    node = settings.node_name or socket.gethostname()
    socket_path = settings.usage.podresources_socket

    async def this_node() -> dict[str, str]:
        return {node: socket_path}

    return PodResourcesAttributor(this_node)


def make_ledger(settings: TelemetrySettings) -> UsageLedger:
    u = settings.usage
    policy = AccountingPolicy(
        interval_s=settings.sample_interval_s,
        max_gap_s=max(u.max_gap_s, settings.sample_interval_s),
        idle_below_pct=u.idle_below_pct,
        idle_window_s=u.idle_window_s,
        max_skew_s=u.max_skew_s,
    )
    rightsizing = RightsizingPolicy(
        window_s=u.rightsizing_window_s,
        min_samples=u.rightsizing_min_samples,
        headroom=u.rightsizing_headroom,
        whole_gpu_below_pct=u.whole_gpu_below_pct,
        whole_gpu_window_s=u.whole_gpu_window_s,
    )
    return UsageLedger(Accountant(policy), settings.pricing.price_book(), RightsizingTracker(rightsizing))


#: name, stream owner, subject, handler factory: what usage needs to bill pods to jobs
USAGE_CONSUMERS = [
    ("jobs-accepted", "admission", subjects.JOB_ACCEPTED, on.on_job_announced),
    ("jobs-admitted", "admission", subjects.JOB_ADMITTED, on.on_job_announced),
    ("placements", "scheduler", subjects.GANG_PLACED, on.on_gang_placed),
    ("gangs-finished", "scheduler", subjects.GANG_FINISHED, on.on_pods_released),
    ("pods-evicted", "scheduler", subjects.PODS_EVICTED, on.on_pods_released),
]


def add_readiness_conditions(app: FastAPI) -> None:
    """`/readyz` also lists conditions that do not make the service unready: nodes whose usage is
    attributed without the kubelet's PodResources API (a detail, not a failure)."""
    original = next(r for r in app.router.routes if isinstance(r, APIRoute) and r.path == "/readyz")
    app.router.routes.remove(original)

    @app.get("/readyz", tags=["health"])
    async def readyz(response: Response) -> dict[str, Any]:
        body: dict[str, Any] = await original.endpoint(response)
        deps: Telemetry | None = getattr(app.state, "deps", None)
        conditions = {}
        if deps is not None and deps.attribution_problems:
            conditions["podresources"] = {
                "status": "degraded",
                "message": "usage of these nodes is attributed per pid or pod from the GPU source, split "
                "equally, because the kubelet's PodResources API cannot be read",
                "nodes": dict(deps.attribution_problems),
            }
        body["conditions"] = conditions
        return body


def build(settings: TelemetrySettings, source: GpuSource | None = None) -> ServiceDefinition[Telemetry]:
    ledger = make_ledger(settings) if settings.usage.enabled else None

    async def dependencies(ctx: ServiceContext) -> Telemetry:
        quiet_http_polls()  # a poll of the GPU source every sample interval is no INFO line
        chosen = source or make_source(settings)
        return Telemetry(
            ctx=ctx,
            source=chosen,
            monitor=make_monitor(settings),
            sample_interval_s=settings.sample_interval_s,
            inventory_interval_s=settings.inventory_interval_s,
            inventory_republish_s=settings.inventory_republish_s,
            ledger=ledger,
            attributor=make_attributor(settings, chosen) if ledger is not None else None,
            usage_flush_s=settings.usage.flush_interval_s,
            usage_nodes=[settings.node_name]
            if settings.node_name and settings.chosen_source() in (SourceKind.NVML, SourceKind.DCGM)
            else None,
            tokens=settings.tokens(),
            currency=ledger.prices.currency if ledger is not None else "USD",
        )

    def consumers(deps: Telemetry) -> list[ConsumerSpec[TelemetryUnitOfWork]]:
        if deps.ledger is None:
            return []
        return [
            ConsumerSpec(f"telemetry-{name}", owner, subject, handler(deps.ledger))
            for name, owner, subject, handler in USAGE_CONSUMERS
        ]

    day_s = 24 * 3600
    return ServiceDefinition(
        name="telemetry",
        outbox=orm.outbox,
        inbox=orm.inbox,
        dependencies=dependencies,
        unit_of_work=TelemetryUnitOfWork,
        consumers=consumers,
        background=[announce_inventory, sample],
        routers=[usage_router],
        configure_app=add_readiness_conditions,
        retention=[
            RetentionRule(orm.gpu_rollups, "window_start", settings.rollup_retention_h * 3600),
            RetentionRule(orm.usage_hourly, "window_start", settings.usage.hourly_retention_days * day_s),
            RetentionRule(orm.usage_daily, "day", settings.usage.daily_retention_days * day_s),
            RetentionRule(orm.pod_placements, "ended_at", settings.usage.hourly_retention_days * day_s),
        ],
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
