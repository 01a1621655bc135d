"""Fakes for unit tests of handlers: a unit of work that keeps everything in memory.

A service's fake combines this with its own unit of work, so handlers typed for the real one accept
it, and installs fake repositories in `open_repositories`:

```
class FakeCheckpointUnitOfWork(FakeUnitOfWork, CheckpointUnitOfWork):
    def open_repositories(self, session: object) -> None:
        self.observed = self.fake_observed     # an in-memory repository kept across units
```
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

from tessera.contracts.base import Message
from tessera.core.db.uow import UnitOfWork
from tessera.core.recording.model import ObservedEvent
from tessera.core.recording.service_layer import RecordingUnitOfWork


class FakeUnitOfWork(UnitOfWork):
    """Commits and outbox rows in lists, the inbox in a set; nothing touches a database."""

    def __init__(self, *_: Any, **__: Any) -> None:
        super().__init__(None, None, None, "tessera/test")  # type: ignore[arg-type]
        self.open = False
        self.commits = 0
        self.outbox: list[Message] = []
        """Events that reached the outbox by a commit, in order."""
        self._pending: list[Message] = []
        self.inbox: set[tuple[str, str]] = set()
        self._pending_inbox: set[tuple[str, str]] = set()

    @property
    def session(self) -> Any:
        raise AssertionError("a handler under test reached for the SQL session; go through a repository")

    async def __aenter__(self) -> Self:
        self.open = True
        self.published = []
        self._pending = []
        self._pending_inbox = set()
        self._tracked, self._tracked_ids = [], set()
        self.open_repositories(None)  # type: ignore[arg-type]
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.open = False
        self._pending = []  # not committed: rolled back
        self._pending_inbox = set()

    async def flush_events(self) -> None:
        self._pending.extend(message for message, _ in self.collect_new_events())

    async def commit(self) -> None:
        await self.flush_events()
        self.outbox.extend(self._pending)
        self.inbox |= self._pending_inbox
        self._pending = []
        self._pending_inbox = set()
        self.commits += 1

    async def publish_many(
        self, messages: Iterable[Message], trace_headers: Mapping[str, str] | None = None
    ) -> list[str]:
        batch = list(messages)
        self._pending.extend(batch)
        self.published.extend(batch)
        return [f"fake-{len(self.outbox) + len(self._pending) - len(batch) + i}" for i in range(len(batch))]

    async def seen(self, consumer: str, message_id: str) -> bool:
        key = (consumer, message_id)
        if key in self.inbox or key in self._pending_inbox:
            return True
        self._pending_inbox.add(key)
        return False

    async def seen_many(self, consumer: str, message_ids: Sequence[str]) -> set[str]:
        return {
            message_id for message_id in dict.fromkeys(message_ids) if await self.seen(consumer, message_id)
        }

    async def unsee(self, consumer: str, message_ids: Sequence[str]) -> None:
        self._pending_inbox -= {(consumer, message_id) for message_id in message_ids}

    async def was_seen(self, consumer: str, message_id: str) -> bool:
        return (consumer, message_id) in self.inbox or (consumer, message_id) in self._pending_inbox

    def events_of(self, kind: type[Message]) -> list[Any]:
        """The committed events of one type."""
        return [m for m in self.outbox if isinstance(m, kind)]


class FakeObservedEventRepository:
    """Observed events in a list, in the order they were added."""

    def __init__(self) -> None:
        self.events: list[ObservedEvent] = []

    async def add(self, event: ObservedEvent) -> None:
        self.events.append(event)


class FakeRecordingUnitOfWork(FakeUnitOfWork, RecordingUnitOfWork):
    """A recording service's unit of work in memory; `recorded` holds what committed units recorded.
    A service's fake adds its own class: `class FakeSlicingUnitOfWork(FakeRecordingUnitOfWork,
    SlicingUnitOfWork): pass`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recorded: list[ObservedEvent] = []
        self._unit = FakeObservedEventRepository()

    def open_repositories(self, session: object) -> None:
        self.observed = self._unit = FakeObservedEventRepository()

    async def commit(self) -> None:
        await super().commit()
        self.recorded.extend(self._unit.events)
        self._unit.events = []
