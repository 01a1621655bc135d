"""Publishing a dead-letter copy when JetStream may not take it (a timeout, a 503 while a node
restarts): the original is terminated only once its copy is stored, so a failed publish never loses
the message."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from tessera.core.observability.ratelimit import RateLimitedLog
from tessera.core.waits import wait_any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeadLetterPublish:
    """How a consumer publishes its dead-letter copies: where, and how long it waits between tries."""

    js: JetStreamContext
    subject: str
    consumer: str
    stop: asyncio.Event
    retry_s: float
    """the first wait before a publish is tried again; it doubles up to `longest_s`"""
    longest_s: float
    failures: RateLimitedLog

    async def publish(self, msg: Msg, body: bytes, headers: dict[str, str], *, deliveries_left: bool) -> bool:
        """Publish the copy of `msg`; True once JetStream stored it, and the caller terminates `msg`.

        On a failure, a message with deliveries left is nak'd (after `retry_s`) and False returned:
        its redelivery is dead-lettered again (the copy's `Nats-Msg-Id` keeps one copy in the
        stream). On its last delivery a nak would never bring it back, so the message is held (its
        ack deadline extended) and the publish tried again until it succeeds; False when the
        consumer stops first (the message then stays in its stream, at its sequence, unsettled)."""
        delay = self.retry_s
        while True:
            try:
                await self.js.publish(self.subject, body, headers=headers)
                return True
            except Exception as exc:
                self.failures.error(
                    f"dlq-publish:{type(exc).__name__}",
                    "publishing a dead-letter copy failed; the message is kept and the copy retried",
                    extra={"consumer": self.consumer, "dlq_subject": self.subject, "error": repr(exc)},
                )
            if deliveries_left:
                await msg.nak(delay=self.retry_s)
                return False
            with contextlib.suppress(Exception):  # NATS away: the next try extends it again
                await msg.in_progress()
            if await wait_any(self.stop, timeout=delay):
                log.error(
                    "stopping with a dead-letter copy unpublished; the message stays in its stream",
                    extra={"consumer": self.consumer, "stream_sequence": msg.metadata.sequence.stream},
                )
                return False
            delay = min(delay * 2, self.longest_s)
