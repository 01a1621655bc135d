"""Turning the gang scheduler's outcomes into persisted state and events, one span per decision."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.trace import Span

from tessera.contracts.base import Message
from tessera.contracts.events import GangPlaced, GangUnschedulable, PodsEvicted
from tessera.core.db.uow import UnitOfWork
from tessera.core.observability.tracing import current_trace_headers
from tessera.scheduler.domain.gang.queue import GangQueue
from tessera.scheduler.domain.gang.scheduler import GangOutcome, OutcomeKind
from tessera.scheduler.domain.snapshot import Allocation
from tessera.scheduler.service_layer.gangs import placement_of, pod_name
from tessera.scheduler.service_layer.repository_port import PlacementRow, SchedulerRepository
from tessera.scheduler.service_layer.tracing import annotate_decision, decision_span

log = logging.getLogger(__name__)


class EventAtCommit:
    """An event the unit of work writes to the outbox when it commits, in the trace that was current
    when it was recorded (``trace_headers``). A cycle records one per gang decided; tracked by the
    unit of work, they go into the outbox together, with one statement, not one each."""

    def __init__(self, message: Message) -> None:
        self.events: list[Message] = [message]
        self.trace_headers = current_trace_headers()


def publish_at_commit(uow: UnitOfWork, message: Message) -> None:
    """Queue ``message`` for the outbox with the commit, in the current trace."""
    uow.track(EventAtCommit(message))


@dataclass
class GangInfo:
    """What the service knows of a gang beyond the domain: its job, trace and members' groups."""

    job_id: str
    source: str
    trace: Mapping[str, str] = field(default_factory=dict)
    groups: dict[str, str] = field(default_factory=dict)  # pod -> pod group
    placed: dict[str, str | None] = field(default_factory=dict)  # pod -> final phase once ended
    announced: str = ""  # the last unschedulable message published
    running_reported: bool = False  # admission was told every pod runs
    resume_from: str | None = None  # the checkpoint its pods resume from (a job's gang)
    submitted_at: float | None = None  # when the job was admitted (a job's gang: its place in line)


def placement_rows(info: GangInfo, allocations: tuple[Allocation, ...]) -> list[PlacementRow]:
    return [
        PlacementRow(
            job_id=info.job_id,
            pod=a.pod,
            pod_group=info.groups.get(a.pod, a.gang),
            node=a.node,
            gpus=a.gpu_milli,
            cpu_milli=a.cpu_milli,
            memory_mib=a.memory_mib,
        )
        for a in allocations
    ]


def rejected_nodes(outcome: GangOutcome) -> dict[str, int]:
    """Nodes rejected per reason; a pod-wide rejection (a pre-filter) counts against every node."""
    diagnosis = outcome.diagnosis
    if diagnosis is None:
        return {}
    if diagnosis.rejected:
        return dict(diagnosis.rejected)
    if diagnosis.pre_filter is not None and diagnosis.nodes_considered:
        return {reason: diagnosis.nodes_considered for reason in diagnosis.pre_filter.reasons}
    return {}


async def record_outcome(
    outcome: GangOutcome,
    info: GangInfo,
    queue: GangQueue,
    repo: SchedulerRepository,
    uow: UnitOfWork,
    uuids: Mapping[str, Mapping[int, str]],
    span: Span | None = None,
) -> None:
    """Persist one decision and publish what it means, inside its ``scheduler.place_gang`` span:
    ``span`` when the attempt opened it (it ends here), else a new one in the job's trace."""
    scope = trace.use_span(span, end_on_exit=True) if span is not None else decision_span(outcome.gang, info)
    with scope as span:
        annotate_decision(span, outcome)
        if outcome.kind is OutcomeKind.WAITING:
            span.set_attribute("reasons", outcome.message)
            return
        if outcome.evicted:
            keys = sorted(a.pod for a in outcome.evicted)
            for key in keys:
                await repo.release_pod(key)
                info.placed.pop(key, None)
            pods = [pod_name(key) for key in keys]
            reason = outcome.reason.value if outcome.reason else "evicted"
            publish_at_commit(
                uow, PodsEvicted(job_id=info.job_id, pods=pods, reason=reason, message=outcome.message)
            )
            span.set_attribute("evicted", len(pods))
        if outcome.kind is OutcomeKind.PLACED:
            await repo.record_placements(placement_rows(info, outcome.bound))
            for allocation in outcome.bound:
                info.placed[allocation.pod] = None
            if outcome.gang not in queue:
                await repo.remove_pending(info.job_id)
            placements = [
                placement_of(a, info.groups.get(a.pod, a.gang), uuids.get(a.node, {})) for a in outcome.bound
            ]
            publish_at_commit(uow, GangPlaced(job_id=info.job_id, placements=placements))
            # every decision is in its span and its event; a log line each would cost the hot path
            # more CPU than the span (13% of the scheduler's at 250 pods/s), so only at DEBUG
            log.debug("gang placed", extra={"job_id": info.job_id, "pods": len(outcome.bound)})
            return
        entry = queue.entry(outcome.gang) if outcome.gang in queue else None
        message = outcome.message or (outcome.reason.value if outcome.reason else outcome.kind.value)
        span.set_attribute("reasons", message)
        if entry is not None:
            reason = entry.last_reason.value if entry.last_reason else ""
            await repo.record_requeued(info.job_id, entry.attempts, reason, message, entry.backoff_until)
        level = logging.INFO
        if outcome.kind in (OutcomeKind.UNSCHEDULABLE, OutcomeKind.TIMED_OUT):
            if message == info.announced:
                level = logging.DEBUG  # said already: a gang waiting for room is retried every backoff
            else:
                rejected = rejected_nodes(outcome)
                publish_at_commit(
                    uow, GangUnschedulable(job_id=info.job_id, message=message, rejected_nodes=rejected)
                )
                info.announced = message
        log.log(
            level,
            "gang not placed",
            extra={"job_id": info.job_id, "outcome": outcome.kind.value, "reasons": message},
        )
