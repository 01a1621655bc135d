"""Wiring of the scheduler service: consumers, the scheduling loop, and the cluster when configured."""

from __future__ import annotations

from collections.abc import Callable

from kubernetes.client import ApiClient

from tessera.cluster.kube import KubernetesCluster, api_client
from tessera.cluster.kube.lease import KubernetesLeaseLock
from tessera.cluster.leader import LeaderElector, default_identity, pod_namespace
from tessera.contracts import subjects
from tessera.core.db.retention import RetentionRule
from tessera.core.messaging.consumer import ConsumerSpec, Handler
from tessera.core.runner import ServiceContext, ServiceDefinition, serve
from tessera.scheduler.adapters import orm
from tessera.scheduler.adapters.cluster_side import ClusterSide
from tessera.scheduler.config import SchedulerSettings, get_settings
from tessera.scheduler.entrypoints.loop import scheduling_loop
from tessera.scheduler.entrypoints.metrics import MeteredEngine, SchedulerMetrics
from tessera.scheduler.entrypoints.podgroup_status import keep_podgroup_status
from tessera.scheduler.service_layer import handlers
from tessera.scheduler.service_layer.dependencies import ClusterConnection, SchedulerDeps
from tessera.scheduler.service_layer.unit_of_work import SchedulerUnitOfWork

# Turns the API client into the `Cluster` port; tests wrap the adapter to inject failures.
ClusterFactory = Callable[[ApiClient], KubernetesCluster]


def leader_elector(api: ApiClient, settings: SchedulerSettings) -> LeaderElector | None:
    """Replicas contend for the Lease; only its holder decides (none when election is off)."""
    election = settings.leader_election
    if not election.enabled:
        return None
    namespace = election.namespace or pod_namespace(settings.namespace)
    lock = KubernetesLeaseLock(api, namespace, election.lease_name)
    return LeaderElector(lock, default_identity(), election.config())


def consumers(deps: SchedulerDeps) -> list[ConsumerSpec[SchedulerUnitOfWork]]:
    """Every handler is replay-safe: its effects are the unit of work's writes and a wake-up of the
    loop after commit (never on a rollback), so a batch runs without savepoints."""
    engine, evt = deps.engine, "telemetry"
    taken: list[tuple[str, str, str, Handler[SchedulerUnitOfWork]]] = [
        ("scheduler-admitted", "admission", subjects.JOB_ADMITTED, handlers.job_admitted_handler(engine)),
        ("scheduler-inventory", evt, subjects.INVENTORY_CHANGED, handlers.inventory_changed_handler(engine)),
        ("scheduler-gpu-health", evt, subjects.GPU_UNHEALTHY, handlers.gpu_unhealthy_handler(engine)),
        (
            "scheduler-preemption",
            "admission",
            subjects.PREEMPTION_REQUESTED,
            handlers.preemption_requested_handler(engine),
        ),
        ("scheduler-job-finished", "admission", subjects.JOB_FINISHED, handlers.job_finished_handler(engine)),
        (
            "scheduler-ready-for-eviction",
            "checkpoint",
            subjects.READY_FOR_EVICTION,
            handlers.ready_for_eviction_handler(engine),
        ),
    ]
    return [
        ConsumerSpec(name, owner, subject, handler, replay_safe=True)
        for name, owner, subject, handler in taken
    ]


def build(
    settings: SchedulerSettings, *, cluster_factory: ClusterFactory | None = None
) -> ServiceDefinition[SchedulerDeps]:
    async def dependencies(ctx: ServiceContext) -> SchedulerDeps:
        metrics = SchedulerMetrics(ctx.metrics.registry)
        if settings.kubeconfig is None:  # inventory mode: places on what telemetry reports
            return SchedulerDeps(ctx, MeteredEngine(ctx.uow, settings).observe_with(metrics))
        api = api_client(kubeconfig=str(settings.kubeconfig), connections=settings.kube_connections)
        cluster = (cluster_factory or KubernetesCluster)(api)
        side = ClusterSide(cluster)
        engine = MeteredEngine(ctx.uow, settings, cluster=side).observe_with(metrics)  # watches the side
        return SchedulerDeps(ctx, engine, ClusterConnection(cluster, side, leader_elector(api, settings)))

    return ServiceDefinition(
        name="scheduler",
        outbox=orm.outbox,
        inbox=orm.inbox,
        unit_of_work=SchedulerUnitOfWork,
        dependencies=dependencies,
        consumers=consumers,
        background=[scheduling_loop, keep_podgroup_status],  # PodGroups' status follows their pods
        # an answer to a preemption that ended otherwise (forced, deadline) is of no use after a day
        retention=[RetentionRule(orm.evictions_ready, "received_at", 24 * 3600.0)],
    )


def main() -> None:
    settings = get_settings()
    serve(build(settings), settings)
