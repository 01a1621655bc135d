"""Wiring of the telemetry service."""

from __future__ import annotations

import socket

from tessera.core.db.retention import RetentionRule
from tessera.core.runner import ServiceContext, ServiceDefinition, serve
from tessera.telemetry.adapters import orm
from tessera.telemetry.config import SourceKind, TelemetrySettings, get_settings
from tessera.telemetry.domain.health import HealthPolicy
from tessera.telemetry.domain.idle import IdlePolicy
from tessera.telemetry.domain.model import GpuSource
from tessera.telemetry.domain.monitor import Monitor
from tessera.telemetry.entrypoints.publishers import announce_inventory, sample
from tessera.telemetry.service_layer.dependencies import Telemetry
from tessera.telemetry.service_layer.unit_of_work import TelemetryUnitOfWork


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

    return NvmlSource(settings.node_name or socket.gethostname())


def make_monitor(settings: TelemetrySettings) -> Monitor:
    return Monitor.with_policies(
        HealthPolicy(**settings.health.model_dump()), IdlePolicy(**settings.idle.model_dump())
    )


def build(settings: TelemetrySettings, source: GpuSource | None = None) -> ServiceDefinition[Telemetry]:
    async def dependencies(ctx: ServiceContext) -> Telemetry:
        return Telemetry(
            ctx=ctx,
            source=source or make_source(settings),
            monitor=make_monitor(settings),
            sample_interval_s=settings.sample_interval_s,
            inventory_interval_s=settings.inventory_interval_s,
            inventory_republish_s=settings.inventory_republish_s,
        )

    return ServiceDefinition(
        name="telemetry",
        outbox=orm.outbox,
        inbox=orm.inbox,
        dependencies=dependencies,
        unit_of_work=TelemetryUnitOfWork,
        background=[announce_inventory, sample],
        retention=[RetentionRule(orm.gpu_rollups, "window_start", settings.rollup_retention_h * 3600)],
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
