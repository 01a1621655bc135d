"""Many outgoing events in one statement: a cycle that admits thousands of jobs writes its
outbox rows with a single executemany, in the cycle's transaction."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import insert

from tessera.admission.adapters.orm import outbox
from tessera.contracts.base import Message
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.envelope import encode
from tessera.core.observability.tracing import current_trace_headers


class OutboxBatch:
    def __init__(self, uow: UnitOfWork) -> None:
        self.uow = uow
        self.rows: list[dict[str, Any]] = []

    def add(self, message: Message, trace_headers: Mapping[str, str] | None = None) -> None:
        headers_in = current_trace_headers() if trace_headers is None else trace_headers
        subject, headers, body = encode(message, self.uow.source, trace_headers=headers_in)
        self.rows.append({"event_id": headers["ce-id"], "subject": subject, "headers": headers, "body": body})
        self.uow.published.append(message)

    async def flush(self) -> None:
        if self.rows:
            await self.uow.session.execute(insert(outbox), self.rows)
            self.rows = []
