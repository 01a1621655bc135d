"""Wiring of the slicing service: consumers record the demand signals; with a cluster, one loop plans
layouts from them and another drives the operations that apply them."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from tessera.cluster.kube import api_client
from tessera.cluster.leader_settings import leader_elector
from tessera.contracts import subjects
from tessera.core.db.retention import RetentionRule
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.recording.repository import RECEIVED_AT
from tessera.core.recording.service_layer import record
from tessera.core.runner import ServiceContext, ServiceDefinition, serve
from tessera.slicing.adapters import orm
from tessera.slicing.adapters.kube import KubeClusterOps
from tessera.slicing.config import SlicingSettings, get_settings
from tessera.slicing.domain.demand import DemandWindow
from tessera.slicing.entrypoints.loops import drive_operations, plan_layouts
from tessera.slicing.service_layer.dependencies import SlicingDeps
from tessera.slicing.service_layer.operating import Operator
from tessera.slicing.service_layer.planning import Planning
from tessera.slicing.service_layer.unit_of_work import SlicingUnitOfWork
from tessera.slicing.service_layer.usage import on_pod_usage


def utc_now() -> datetime:
    return datetime.now(UTC)


def consumers(_deps: object = None) -> list[ConsumerSpec[SlicingUnitOfWork]]:
    """Every signal is recorded; the planning loop reads them back in order."""
    return [
        ConsumerSpec("slicing-scheduler-events", "scheduler", "tessera.scheduler.evt.>", record),
        ConsumerSpec("slicing-inventory", "telemetry", subjects.INVENTORY_CHANGED, record),
        ConsumerSpec("slicing-gpu-idle", "telemetry", subjects.GPU_IDLE, record),
        # each pod's measured use, folded into minutes for packing time-sliced GPUs by use
        ConsumerSpec("slicing-pod-usage", "telemetry", subjects.ALL_POD_GPU_USAGE, on_pod_usage),
        ConsumerSpec("slicing-forecasts", "forecaster", subjects.FORECAST_UPDATED, record),
        # a drained GPU's checkpointable job may be moved once the checkpoint service lets it go
        ConsumerSpec("slicing-ready-for-eviction", "checkpoint", subjects.READY_FOR_EVICTION, record),
    ]


def build(settings: SlicingSettings) -> ServiceDefinition[SlicingDeps]:
    async def dependencies(ctx: ServiceContext) -> SlicingDeps:
        deps = SlicingDeps(ctx.stop, settings.tick_s)
        if settings.kubeconfig is None:
            return deps
        api = api_client(kubeconfig=str(settings.kubeconfig))
        cluster = KubeClusterOps(
            api,
            operator_namespace=settings.operator_namespace,
            mig_configmap=settings.mig_configmap,
            device_plugin_configmap=settings.device_plugin_configmap,
            events_namespace=settings.events_namespace,
        )
        plan = settings.planning
        notice = settings.operations.checkpoint_notice_s
        deps.planning = Planning(
            cluster, ctx.uow, DemandWindow(plan.window_s, plan.idle_s), plan.planner(), utc_now
        )
        deps.operator = Operator(
            cluster,
            ctx.uow,
            settings.replica,
            settings.operations.policy(),
            timedelta(seconds=settings.lease_s),
            utc_now,
            checkpoint_notice=timedelta(seconds=notice) if notice is not None else None,
        )
        deps.wake = asyncio.Event()
        deps.leader = leader_elector(api, settings.leader_election, settings.events_namespace)
        return deps

    return ServiceDefinition(
        name="slicing",
        outbox=orm.outbox,
        inbox=orm.inbox,
        unit_of_work=SlicingUnitOfWork,
        dependencies=dependencies,
        consumers=consumers,
        # A finished task makes the service unready: the loops run only with a cluster to act on.
        background=[plan_layouts, drive_operations] if settings.kubeconfig else [],
        retention=[
            RetentionRule(orm.observed_events, RECEIVED_AT, settings.observed_retention_h * 3600),
            # the usage history's window, and a minute more for the minute being written
            RetentionRule(orm.pod_usage, "minute", (settings.planning.usage_lookback_minutes + 1) * 60.0),
        ],
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
