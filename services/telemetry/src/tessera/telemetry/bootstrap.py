"""Wiring of the telemetry service."""

from __future__ import annotations

from tessera.core.runner import ServiceContext, ServiceDefinition, serve
from tessera.telemetry.adapters import orm
from tessera.telemetry.adapters.cluster_file import ClusterFileSource
from tessera.telemetry.config import TelemetrySettings, get_settings
from tessera.telemetry.domain.model import GpuSource
from tessera.telemetry.entrypoints.publishers import announce_inventory, publish_samples


def make_source(settings: TelemetrySettings) -> GpuSource:
    if settings.cluster_file is None:
        raise ValueError("TESSERA_TELEMETRY_CLUSTER_FILE is required: the GPU inventory to report")
    return ClusterFileSource(settings.cluster_file)


def build(settings: TelemetrySettings, source: GpuSource | None = None) -> ServiceDefinition:
    async def on_start(ctx: ServiceContext) -> None:
        ctx.extras.update(
            source=source or make_source(settings),
            sample_interval_s=settings.sample_interval_s,
            inventory_interval_s=settings.inventory_interval_s,
            inventory_republish_s=settings.inventory_republish_s,
        )

    return ServiceDefinition(
        name="telemetry",
        metadata=orm.metadata,
        outbox=orm.outbox,
        inbox=orm.inbox,
        background=[announce_inventory, publish_samples],
        on_start=on_start,
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
