"""What a durable consumer reads and which handler takes each message."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.dead_letters import DeadLetter
from tessera.core.messaging.envelope import Envelope
from tessera.core.settings import ConsumerSettings

UowT = TypeVar("UowT", bound=UnitOfWork)
Handler = Callable[[Envelope, UowT], Awaitable[None]]
DeadLetterHook = Callable[[DeadLetter, UowT], Awaitable[None]]


@dataclass(frozen=True)
class ConsumerSpec(Generic[UowT]):
    """A durable consumer: what it reads and which handler takes each message.

    Delivery settings (`max_deliver`, `ack_wait_s`, `batch`, backoff) come from the service's
    `consumer` settings, applied by the runner; `settings` overrides them for this consumer alone."""

    name: str
    stream_owner: str
    filter_subject: str
    handler: Handler[UowT]
    settings: ConsumerSettings | None = None
    linger_s: float = 0.01
    """After a fetch, wait this long for more messages to join the batch (0: handle what came)."""
    on_dead_letter: DeadLetterHook[UowT] | None = None
    """Runs in its own unit of work before a message is dead-lettered (at most once per message id),
    so the service can answer its sender: admission rejects a submission it can never handle."""
    replay_safe: bool = False
    """The handler's effects all live in its unit of work (its writes, its events, callbacks run
    after commit), so running it again after its transaction was rolled back does nothing twice.
    A batch of such a consumer runs without savepoints; when a handler fails, the batch is rolled
    back and run again with a savepoint per message, the failed one not run again. Leave it False
    for a handler with effects outside the transaction (a cache, an API call): a batch then takes
    a savepoint before each handler after the first, and a handler that succeeded never runs twice."""

    def configured(self, defaults: ConsumerSettings) -> ConsumerSpec[UowT]:
        return self if self.settings is not None else replace(self, settings=defaults)

    @property
    def delivery(self) -> ConsumerSettings:
        return self.settings if self.settings is not None else ConsumerSettings()

    @property
    def max_deliver(self) -> int:
        return self.delivery.max_deliver

    @property
    def ack_wait_s(self) -> float:
        return self.delivery.ack_wait_s

    @property
    def batch(self) -> int:
        return self.delivery.batch

    @property
    def backoff_base_s(self) -> float:
        return self.delivery.backoff_base_s

    @property
    def backoff_max_s(self) -> float:
        return self.delivery.backoff_max_s

    @property
    def max_message_bytes(self) -> int:
        return self.delivery.max_message_bytes
