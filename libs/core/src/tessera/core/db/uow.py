"""The unit of work: one transaction for the state change, its outgoing events and the inbox record.

A service subclasses `UnitOfWork` to open its repositories on the transaction's session
(`open_repositories`). Aggregates record the events they cause in `events`; repositories `track`
the aggregates they load or add, and `commit()` moves every collected event into the outbox in the
same transaction before it commits (cosmicpython's `collect_new_events`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, Self

from sqlalchemy import String, Table, any_, bindparam, delete, func, insert, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tessera.contracts.base import Message
from tessera.core.messaging.envelope import encode
from tessera.core.observability.tracing import current_trace_headers


class Aggregate(Protocol):
    """Anything that records the events it causes, to be published when its unit of work commits.

    An aggregate that carries its own trace context (a job's `traceparent`) may expose it as
    `trace_headers`; its events are then published in that trace rather than the current one."""

    events: list[Message]


class UnitOfWork:
    """`async with uow:` opens a transaction; leaving without `commit()` rolls it back."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        outbox: Table,
        inbox: Table,
        source: str,
        after_commit: Callable[[], None] | None = None,
    ) -> None:
        self._sessions = sessions
        self._outbox = outbox
        self._inbox = inbox
        self.source = source
        self._after_commit = after_commit
        self._session: AsyncSession | None = None
        self._tracked: list[Aggregate] = []
        self._tracked_ids: set[int] = set()
        self.published: list[Message] = []

    @property
    def session(self) -> AsyncSession:
        if self._session is None:
            raise RuntimeError("the unit of work is not open; use `async with uow:`")
        return self._session

    def open_repositories(self, session: AsyncSession) -> None:
        """Subclasses build their repositories on `session` here; called each time the unit opens."""

    async def __aenter__(self) -> Self:
        self._session = self._sessions()
        self.published = []
        self._tracked, self._tracked_ids = [], set()
        await self._session.begin()
        self.open_repositories(self._session)
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

    def track(self, aggregate: Aggregate) -> None:
        """Collect `aggregate`'s events at commit; repositories call this for what they load or add."""
        if id(aggregate) not in self._tracked_ids:  # by identity: a cycle tracks thousands of jobs
            self._tracked_ids.add(id(aggregate))
            self._tracked.append(aggregate)

    def collect_new_events(self) -> list[tuple[Message, Mapping[str, str] | None]]:
        """Every event the tracked aggregates recorded, with the trace each belongs to; clears them."""
        collected: list[tuple[Message, Mapping[str, str] | None]] = []
        for aggregate in self._tracked:
            trace: Mapping[str, str] | None = getattr(aggregate, "trace_headers", None)
            collected.extend((event, trace) for event in aggregate.events)
            aggregate.events = []
        return collected

    async def flush_events(self) -> None:
        """Write the tracked aggregates' events into the outbox now (inside a savepoint, say)."""
        rows = [self._row(message, trace) for message, trace in self.collect_new_events()]
        if rows:
            await self.session.execute(insert(self._outbox), rows)

    def forget_events(self) -> None:
        """Drop what the tracked aggregates recorded: their changes were rolled back."""
        for aggregate in self._tracked:
            aggregate.events = []
        self._tracked, self._tracked_ids = [], set()

    async def commit(self) -> None:
        await self.flush_events()
        await self.session.commit()
        if self.published and self._after_commit is not None:
            self._after_commit()

    async def publish(self, message: Message) -> str:
        """Queue an event in the outbox, in this transaction, carrying the current trace context."""
        return (await self.publish_many([message]))[0]

    async def publish_many(
        self, messages: Iterable[Message], trace_headers: Mapping[str, str] | None = None
    ) -> list[str]:
        """Queue many events with one statement (a cycle that admits thousands of jobs)."""
        headers_in = current_trace_headers() if trace_headers is None else trace_headers
        rows = [self._row(message, headers_in) for message in messages]
        if rows:
            await self.session.execute(insert(self._outbox), rows)
        return [row["event_id"] for row in rows]

    def _row(self, message: Message, trace_headers: Mapping[str, str] | None) -> dict[str, Any]:
        headers_in = current_trace_headers() if trace_headers is None else trace_headers
        subject, headers, body = encode(message, self.source, trace_headers=headers_in)
        self.published.append(message)
        return {"event_id": headers["ce-id"], "subject": subject, "headers": headers, "body": body}

    async def seen(self, consumer: str, message_id: str) -> bool:
        """Record `message_id` for `consumer`; True when it was already handled (a redelivery)."""
        result = await self.session.execute(
            pg_insert(self._inbox)
            .values(consumer=consumer, message_id=message_id)
            .on_conflict_do_nothing()
            .returning(self._inbox.c.message_id)
        )
        return result.first() is None

    async def seen_many(self, consumer: str, message_ids: Sequence[str]) -> set[str]:
        """Record every id for `consumer` with one statement; the ids that were already recorded
        (redeliveries). A consumer takes a batch's inbox rows this way, then `unsee`s the ids whose
        handling it rolled back, in the same transaction."""
        unique = list(dict.fromkeys(message_ids))
        if not unique:
            return set()
        inbox = self._inbox
        statement = (
            pg_insert(inbox)
            .from_select(
                ["consumer", "message_id"],
                select(
                    bindparam("consumer", type_=String),
                    func.unnest(bindparam("message_ids", type_=ARRAY(String))),
                ),
            )
            .on_conflict_do_nothing()
            .returning(inbox.c.message_id)
        )
        result = await self.session.execute(statement, {"consumer": consumer, "message_ids": unique})
        return set(unique).difference(result.scalars())

    async def unsee(self, consumer: str, message_ids: Sequence[str]) -> None:
        """Remove inbox rows recorded in this transaction for messages whose handling failed."""
        if message_ids:
            inbox = self._inbox
            await self.session.execute(
                delete(inbox).where(
                    inbox.c.consumer == consumer,
                    inbox.c.message_id == any_(bindparam("message_ids", type_=ARRAY(String))),
                ),
                {"message_ids": list(message_ids)},
            )

    async def was_seen(self, consumer: str, message_id: str) -> bool:
        row = await self.session.execute(
            select(self._inbox.c.message_id).where(
                self._inbox.c.consumer == consumer, self._inbox.c.message_id == message_id
            )
        )
        return row.first() is not None
