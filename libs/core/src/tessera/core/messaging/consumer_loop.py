"""The pull loop of a durable consumer: subscribe, fetch, hand each batch over, and subscribe again
when the durable consumer or its stream has gone (deleted, or NATS restored without its JetStream
data), instead of fetching from nothing for ever."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Generic

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.errors import APIError, NotFoundError, ServiceUnavailableError

from tessera.contracts import subjects
from tessera.core.messaging.consumer_spec import ConsumerSpec, UowT
from tessera.core.messaging.pull_queue import take_queued_at_once
from tessera.core.observability.metrics import Metrics
from tessera.core.observability.ratelimit import RateLimitedLog
from tessera.core.waits import wait_any

log = logging.getLogger(__name__)

#: a fetch refused like this says the durable consumer or its stream is not there (no responders to
#: the pull request answer 503; 404 "not found", 409 "consumer deleted")
GONE_CODES = frozenset({404, 409, 503})
#: fetches failing in a row, whatever the error, after which the consumer subscribes again
FAILED_FETCHES_BEFORE_RESUBSCRIBING = 3
#: the longest wait between two resubscriptions in a row that did not bring a fetch back
LONGEST_RESUBSCRIBE_WAIT_S = 5.0
#: how often at most a running consumer reads its durable consumer's ack floor, where the durable
#: consumer starts if it must be created again
ACK_FLOOR_REFRESH_S = 5.0
#: how long a read of the ack floor may hold up the loop (NATS away: the last one read stands)
ACK_FLOOR_READ_TIMEOUT_S = 2.0

EnsureStream = Callable[[], Awaitable[None]]


class PullLoop(Generic[UowT]):
    """The loop :class:`~tessera.core.messaging.consumer.ConsumerRunner` runs; it handles batches."""

    js: JetStreamContext
    spec: ConsumerSpec[UowT]
    metrics: Metrics
    stop: asyncio.Event
    subscribed: asyncio.Event
    ensure_stream: EnsureStream | None
    """creates (or brings to its limits) the stream when this service owns it; None otherwise"""
    _failures: RateLimitedLog
    _stream_created: datetime | None = None
    """when the stream this runner read was created: another one is read from its start"""
    _resume_from: int | None = None
    """Where a durable consumer created again starts: just above the durable consumer's ack floor
    when last read (every message below it settled, by any replica reading it), so no message
    that is not settled (nak'd, or in flight in another replica) is skipped, and only those
    settled since the last read (seconds) are delivered again, which the inbox drops. None: from
    the stream's start. It belongs to the stream created at `_stream_created`."""
    _floor_read_at: float | None = None
    _floor_stale: bool = False
    """messages were delivered since the ack floor was last read"""
    _limit_lifted: bool = False
    """the durable consumer is known to deliver without a limit (:meth:`_deliver_without_limit`)"""

    async def handle_batch(self, msgs: list[Msg]) -> None:
        raise NotImplementedError

    async def _read_ack_floor(self, sub: JetStreamContext.PullSubscription) -> ConsumerInfo | None:
        """Read the durable consumer's ack floor (`_resume_from`); the last one read stands when it
        cannot be read (the durable consumer gone, or NATS away)."""
        self._floor_read_at, self._floor_stale = time.monotonic(), False
        try:
            info = await asyncio.wait_for(sub.consumer_info(), ACK_FLOOR_READ_TIMEOUT_S)
        except Exception:
            return None
        floor = info.ack_floor.stream_seq if info.ack_floor is not None else None
        self._resume_from = floor + 1 if floor else None
        return info

    async def _deliver_without_limit(self, stream: str, info: ConsumerInfo | None) -> None:
        """JetStream stops delivering a message at the durable consumer's `max_deliver`, settled or
        not: a message whose dead-letter copy could not be stored on its last delivery would stay
        in its stream for ever. The runner counts deliveries itself (a message past its spec's
        `max_deliver` is dead-lettered), so a durable consumer created with a limit (by an earlier
        release) is updated to have none. Until that is done, every ack floor read tries again."""
        if info is None:
            return
        if info.config.max_deliver in (None, -1, 0):
            self._limit_lifted = True
            return
        try:
            await self.js.add_consumer(stream, config=info.config.evolve(max_deliver=-1))
            self._limit_lifted = True
            log.info("the durable consumer now delivers without a limit", extra={"consumer": self.spec.name})
        except Exception as exc:  # tried again at the next ack floor read
            log.warning(
                "lifting the durable consumer's delivery limit failed",
                extra={"consumer": self.spec.name, "error": repr(exc)},
            )

    async def _read_ack_floor_if_due(self, sub: JetStreamContext.PullSubscription, *, idle: bool) -> None:
        """Read the ack floor on the first idle fetch after deliveries, and every few seconds at
        most while busy: one request per consumer then, none while nothing comes, unless the
        durable consumer's delivery limit is not yet lifted (its info could not be read when
        subscribing, say): then every few seconds, and the limit is lifted once it is read."""
        due = self._floor_read_at is None or time.monotonic() - self._floor_read_at >= ACK_FLOOR_REFRESH_S
        if not (self._floor_stale and (idle or due)) and (self._limit_lifted or not due):
            return
        info = await self._read_ack_floor(sub)
        if not self._limit_lifted:
            await self._deliver_without_limit(subjects.stream_name(self.spec.stream_owner), info)

    async def _subscribe(self) -> JetStreamContext.PullSubscription:
        """Bind to the durable consumer, creating it when it is not there (from the stream's start,
        or above its ack floor when it was there before), once its stream is there."""
        stream = subjects.stream_name(self.spec.stream_owner)
        delay = 0.2
        while not self.stop.is_set():
            try:
                info = await self.js.stream_info(stream)
                if info.created != self._stream_created:
                    self._resume_from = None  # a stream created anew: read it all
                resume_from = self._resume_from
                if info.state.last_seq + 1 < (resume_from or 0):
                    resume_from = None  # a stream restored from before: read it all
                config = ConsumerConfig(
                    durable_name=self.spec.name,
                    ack_policy=AckPolicy.EXPLICIT,
                    deliver_policy=DeliverPolicy.ALL
                    if resume_from is None
                    else DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=resume_from,
                    max_deliver=-1,  # the runner counts deliveries (_deliver_without_limit)
                    ack_wait=self.spec.ack_wait_s,
                    filter_subject=self.spec.filter_subject,
                )
                sub = await self.js.pull_subscribe(
                    self.spec.filter_subject,
                    durable=self.spec.name,
                    stream=stream,
                    config=config,
                )
                take_queued_at_once(getattr(sub, "_sub", None))  # a batch without a task per message
                self._stream_created = info.created
                self._limit_lifted = False
                await self._deliver_without_limit(stream, await self._read_ack_floor(sub))
                self.subscribed.set()
                return sub
            except NotFoundError:
                log.info("waiting for stream", extra={"stream": stream})
            except Exception:
                log.exception("subscribe failed; retrying", extra={"consumer": self.spec.name})
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
        raise asyncio.CancelledError

    async def _fetch(self, sub: JetStreamContext.PullSubscription) -> list[Msg]:
        """Wait up to a second for the first message; it comes with every message already there,
        up to the batch (one pull request, `no_wait` with `expires`: the server answers as soon as
        it has any). A trickle is handled at once and a flood in full batches, since a backlog piles
        up while a batch is handled. With the spec's `linger_s`, a second pull then waits that long
        for more (one more round trip, and `linger_s` more latency, per batch)."""
        msgs = await sub.fetch(self.spec.batch, timeout=1.0)
        if self.spec.linger_s and len(msgs) < self.spec.batch:
            with contextlib.suppress(TimeoutError):
                msgs += await sub.fetch(self.spec.batch - len(msgs), timeout=self.spec.linger_s)
        return msgs

    async def run(self) -> None:
        sub = await self._subscribe()
        failed = 0  # fetches failed in a row
        resubscribed = 0  # resubscriptions in a row with no fetch answered since
        while not self.stop.is_set():
            try:
                msgs = await self._fetch(sub)
            except TimeoutError:
                failed = resubscribed = 0
                self.metrics.consumer_lag.labels(self.spec.name).set(0)
                await self._read_ack_floor_if_due(sub, idle=True)
                continue
            except Exception as exc:
                if self.stop.is_set():
                    break
                failed += 1
                self._failures.error(
                    f"fetch:{type(exc).__name__}",
                    "fetch failed; retrying",
                    extra={"consumer": self.spec.name, "error": repr(exc)},
                )
                if _gone(exc) or failed >= FAILED_FETCHES_BEFORE_RESUBSCRIBING:
                    sub = await self._resubscribe(sub, exc, resubscribed)
                    failed, resubscribed = 0, resubscribed + 1
                else:
                    await asyncio.sleep(0.5)
                continue
            failed = resubscribed = 0
            self._floor_stale = True
            try:
                await self.handle_batch(msgs)
            except Exception as exc:
                # Say an ack failed on a NATS hiccup: whatever was not acked is redelivered after
                # ack_wait and the inbox drops what was already handled, so the consumer goes on.
                self._failures.error(
                    f"settle:{type(exc).__name__}",
                    "settling a batch failed; unacked messages will be redelivered",
                    extra={"consumer": self.spec.name},
                    exc_info=True,
                )
                await asyncio.sleep(0.5)
            await self._read_ack_floor_if_due(sub, idle=False)
        with contextlib.suppress(Exception):
            await sub.unsubscribe()

    async def _resubscribe(
        self, sub: JetStreamContext.PullSubscription, cause: Exception, in_a_row: int
    ) -> JetStreamContext.PullSubscription:
        """The durable consumer (or its stream) may be gone: create the stream again when this
        service owns it, then the durable consumer (the subscription waits for a stream it does not
        own). Resubscriptions in a row wait longer and longer first, up to five seconds."""
        self.subscribed.clear()
        self.metrics.consumer_resubscribes.labels(self.spec.name).inc()
        log.warning(
            "the consumer's fetches fail; subscribing again",
            extra={"consumer": self.spec.name, "error": repr(cause), "in_a_row": in_a_row + 1},
        )
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        if in_a_row and await wait_any(
            self.stop, timeout=min(LONGEST_RESUBSCRIBE_WAIT_S, 0.25 * 2**in_a_row)
        ):
            raise asyncio.CancelledError
        if self.ensure_stream is not None:
            try:
                await self.ensure_stream()
            except Exception as exc:  # JetStream away: the subscription below waits for it
                log.warning(
                    "ensuring the stream failed", extra={"consumer": self.spec.name, "error": repr(exc)}
                )
        return await self._subscribe()


def _gone(exc: Exception) -> bool:
    if isinstance(exc, ServiceUnavailableError | NotFoundError):  # nats.py raises the 503 without a code
        return True
    return isinstance(exc, APIError) and exc.code in GONE_CODES
