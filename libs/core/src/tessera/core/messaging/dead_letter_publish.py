"""Publishing a dead-letter copy when JetStream may not take it (a timeout, a 503 while a node
restarts): the original is terminated only once its copy is stored, so a failed publish never loses
the message."""

from __future__ import annotations

from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from tessera.core.observability.ratelimit import RateLimitedLog


@dataclass(frozen=True)
class DeadLetterPublish:
    """How a consumer publishes its dead-letter copies, and where."""

    js: JetStreamContext
    subject: str
    consumer: str
    failures: RateLimitedLog

    async def publish(self, msg: Msg, body: bytes, headers: dict[str, str], *, retry_in_s: float) -> bool:
        """Publish the copy of `msg`; True once JetStream stored it, and the caller terminates `msg`.

        On a failure the message is nak'd, to come back in `retry_in_s`, and False returned: nothing
        is held meanwhile, so the consumer goes on with other messages, and the redelivery is
        dead-lettered again. The durable consumer delivers without a limit (the runner counts
        deliveries itself), so the message comes back however many tries that takes, even after a
        restart; the copy's `Nats-Msg-Id` keeps one copy in the stream."""
        try:
            await self.js.publish(self.subject, body, headers=headers)
            return True
        except Exception as exc:
            self.failures.error(
                f"dlq-publish:{type(exc).__name__}",
                "publishing a dead-letter copy failed; the message is kept and dead-lettered again when it comes back",
                extra={
                    "consumer": self.consumer,
                    "dlq_subject": self.subject,
                    "stream_sequence": msg.metadata.sequence.stream,
                    "error": repr(exc),
                },
            )
        await msg.nak(delay=retry_in_s)
        return False
