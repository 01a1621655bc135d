"""Requests past their deadline time out: the job is evicted with whatever it saved before.

The deadlines live in the table, not in timers, so a request made before a restart still times out
after it, exactly once: the overdue rows are locked (`SKIP LOCKED`, for replicas) and their end is
committed together with the events that announce it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from tessera.checkpoint.domain.model import CheckpointRequest
from tessera.checkpoint.service_layer.unit_of_work import CheckpointUnitOfWork

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Expired:
    requests: list[CheckpointRequest]
    next_deadline: datetime | None
    more: bool
    """The batch was full: overdue requests may remain."""


async def expire_overdue(uow: CheckpointUnitOfWork, now: datetime, limit: int = 100) -> Expired:
    due = await uow.requests.due(now, limit)
    for request in due:
        request.time_out(await uow.checkpoints.latest(request.job_id), now)
        await uow.requests.save(request)
        log.warning(
            "checkpoint request timed out: ready for eviction",
            extra={"job_id": request.job_id, "request_id": request.request_id, "reason": request.reason},
        )
    return Expired(due, await uow.requests.next_deadline(), more=len(due) == limit)
