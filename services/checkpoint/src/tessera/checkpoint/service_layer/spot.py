"""Nodes about to go: every checkpointable job with a pod on one is asked to save before it goes.

Each signal (a taint, a label) is acted on once: the signal row is written in the same transaction
as the requests it causes, so a restart, which sees every node again, asks nobody twice; a job asked
already (by a preemption, or another node of its gang) keeps its one open request."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from datetime import datetime

from tessera.checkpoint.domain.model import DEADLINE_PASSED, CheckpointRequest
from tessera.checkpoint.domain.signals import NodeSignal, NodeState, TerminationPolicy
from tessera.checkpoint.service_layer.unit_of_work import CheckpointUnitOfWork
from tessera.core.observability.tracing import current_trace_headers, tracer

log = logging.getLogger(__name__)


async def reconcile_nodes(
    uow: CheckpointUnitOfWork,
    nodes: Mapping[str, NodeState | None],
    policy: TerminationPolicy,
    now: datetime,
) -> list[CheckpointRequest]:
    """Act on the signals the nodes carry now (None: the node is gone); the requests made."""
    asked: list[CheckpointRequest] = []
    for name, node in sorted(nodes.items()):
        signals = policy.signals(node, now) if node is not None else []
        await uow.signals.keep_only(name, [signal.key for signal in signals])
        for signal in signals:
            if await uow.signals.note(signal):
                asked += await _ask_jobs_on(uow, signal, now)
    return asked


async def _ask_jobs_on(
    uow: CheckpointUnitOfWork, signal: NodeSignal, now: datetime
) -> list[CheckpointRequest]:
    with tracer().start_as_current_span(
        "checkpoint.node_signal",
        attributes={"node": signal.node, "signal": signal.key, "reason": signal.reason},
    ):
        log.warning(
            "node is going away",
            extra={"node": signal.node, "signal": signal.key, "deadline": signal.deadline.isoformat()},
        )
        asked: list[CheckpointRequest] = []
        for job in await uow.jobs.on_node(signal.node):
            if not job.checkpointable:
                continue
            pending = await uow.requests.open_for(job.job_id)
            if pending is not None:
                if pending.also_for(signal.deadline, now):
                    await uow.requests.save(pending)
                continue
            if signal.deadline <= now:
                latest = await uow.checkpoints.latest(job.job_id)
                job.release_now(DEADLINE_PASSED, latest, now, cause=signal.reason)
                continue
            request = CheckpointRequest.ask(
                str(uuid.uuid4()),
                job.job_id,
                signal.reason,
                signal.deadline,
                now,
                trace_headers=current_trace_headers(),
            )
            if await uow.requests.add(request):
                log.info(
                    "asked to checkpoint before the node goes",
                    extra={"job_id": job.job_id, "node": signal.node, "request_id": request.request_id},
                )
                asked.append(request)
        return asked
