"""Preemption, the scheduler's part: evict a victim admission chose, free its GPUs, report it released.

A job that left admission for good (``job_finished``: cancelled, finished) is withdrawn the same
way, at once and without a report: whatever it still holds or waits for is let go.

A victim that cannot checkpoint (or a forced request) is evicted at once; one that can is evicted
when the checkpoint service says it may go (``ready_for_eviction``: saved, failed or timed out),
or at the request's deadline if that word never comes, with the request's grace period. Its pods leave the cache, parked gangs hear that
capacity was freed, and admission gets ``report_job_outcome(preempted)``.
"""

from __future__ import annotations

import logging

from opentelemetry import propagate

from tessera.cluster.domain.requirements import PodRef
from tessera.cluster.port import ClusterError, NotFound
from tessera.contracts.events import PodsEvicted, ReportJobOutcome
from tessera.core.db.uow import UnitOfWork
from tessera.core.observability.tracing import tracer
from tessera.scheduler.adapters.cluster_side import ClusterSide
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.domain.gang.queue import ClusterEvent
from tessera.scheduler.service_layer.engine_state import EngineState
from tessera.scheduler.service_layer.gangs import job_pod_names, pod_name
from tessera.scheduler.service_layer.repository_port import JOB, Preemption, SchedulerRepository

log = logging.getLogger(__name__)


async def preempt_due(
    repo: SchedulerRepository,
    uow: UnitOfWork,
    state: EngineState,
    cluster: ClusterSide | None,
    settings: SchedulerSettings,
    now: float,
) -> float | None:
    """Evict every victim that is due; returns the next deadline still to come, if any."""
    for request in await repo.due_preemptions(now):
        info = state.gangs.get(request.job_id)
        victim_trace = propagate.extract(dict(info.trace)) if info is not None else None
        with tracer().start_as_current_span(
            "scheduler.preempt",
            context=victim_trace,  # in the victim's trace, where admission asked for it
            attributes={"job_id": request.job_id, "preemptor": request.preemptor_job_id or ""},
        ) as span:
            evicted = await _evict(request, repo, state, cluster, settings, now)
            span.set_attribute("evicted", len(evicted))
            withdrawn = not request.preemptor_job_id
            if evicted:
                await uow.publish(
                    PodsEvicted(
                        job_id=request.job_id,
                        pods=[pod_name(key) for key in evicted],
                        reason="withdrawn" if withdrawn else "preempted",
                        message=request.reason
                        if withdrawn
                        else f"preempted for {request.preemptor_job_id}: {request.reason}",
                    )
                )
            if not withdrawn:
                await uow.publish(
                    ReportJobOutcome(
                        job_id=request.job_id,
                        state="preempted",
                        reason=f"{len(evicted)} pods evicted for {request.preemptor_job_id}"
                        + (f" after {request.ready}" if request.ready else ""),
                    )
                )
            await repo.remove_preemption(request.job_id)
            log.info("victim evicted", extra={"job_id": request.job_id, "pods": len(evicted)})
    return await repo.next_preemption_deadline()


async def _evict(
    request: Preemption,
    repo: SchedulerRepository,
    state: EngineState,
    cluster: ClusterSide | None,
    settings: SchedulerSettings,
    now: float,
) -> list[str]:
    gang = request.job_id
    info = state.gangs.pop(gang, None)
    spec = state.specs.pop(gang, None)
    scheduler, cache = state.assembly.scheduler, state.assembly.cache
    held = sorted(key for key, phase in (info.placed.items() if info else ()) if phase is None)
    for key in held:
        cache.remove_pod(key)
    if gang in state.assembly.registry:
        scheduler.gang_finished(gang, now)
    scheduler.notify(ClusterEvent.CAPACITY_FREED, now)
    if cluster is not None:
        pods = set(held)
        if spec is not None and (info is None or info.source == JOB):
            pods |= {m.key for m in job_pod_names(gang, spec, settings.namespace)}
        for key in sorted(pods):
            try:
                await cluster.cluster.evict(PodRef.parse(key), grace_period_seconds=request.grace_period_s)
            except NotFound:
                continue
            except (ClusterError, OSError) as error:  # OSError: TimeoutError, no answer in time
                log.warning("eviction of a victim failed", extra={"pod": key, "error": str(error)})
    await repo.release_job(gang)
    await repo.remove_pending(gang)
    return held
