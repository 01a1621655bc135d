"""The unit of work: one transaction for the state change, its outgoing events and the inbox record."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from sqlalchemy import Table, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tessera.contracts.base import Message
from tessera.core.messaging.envelope import encode
from tessera.core.observability.tracing import current_trace_headers


class UnitOfWork:
    """`async with uow:` opens a transaction; leaving without `commit()` rolls it back."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], outbox: Table, inbox: Table, source: str
    ) -> None:
        self._sessions = sessions
        self._outbox = outbox
        self._inbox = inbox
        self.source = source
        self._session: AsyncSession | None = None
        self.published: list[Message] = []

    @property
    def session(self) -> AsyncSession:
        if self._session is None:
            raise RuntimeError("the unit of work is not open; use `async with uow:`")
        return self._session

    async def __aenter__(self) -> Self:
        self._session = self._sessions()
        self.published = []
        await self._session.begin()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._session is not None
        try:
            if self._session.in_transaction():
                await self._session.rollback()
        finally:
            await self._session.close()
            self._session = None

    async def commit(self) -> None:
        await self.session.commit()

    async def publish(self, message: Message) -> str:
        """Queue an event in the outbox, in this transaction, carrying the current trace context."""
        subject, headers, body = encode(message, self.source, trace_headers=current_trace_headers())
        await self.session.execute(
            insert(self._outbox).values(
                event_id=headers["ce-id"], subject=subject, headers=headers, body=body
            )
        )
        self.published.append(message)
        return headers["ce-id"]

    async def seen(self, consumer: str, message_id: str) -> bool:
        """Record `message_id` for `consumer`; True when it was already handled (a redelivery)."""
        result = await self.session.execute(
            pg_insert(self._inbox)
            .values(consumer=consumer, message_id=message_id)
            .on_conflict_do_nothing()
            .returning(self._inbox.c.message_id)
        )
        return result.first() is None

    async def was_seen(self, consumer: str, message_id: str) -> bool:
        row = await self.session.execute(
            select(self._inbox.c.message_id).where(
                self._inbox.c.consumer == consumer, self._inbox.c.message_id == message_id
            )
        )
        return row.first() is not None
