"""The training process's side of the checkpoint protocol, on a background thread with its own loop.

Listens for `save_checkpoint` on the job's subject and publishes `report_checkpoint` as CloudEvents
(binary mode, `Nats-Msg-Id`). The training loop never waits on NATS: a request only sets a flag that
`Checkpointer.step` reads, and a report is handed to this thread's loop.

Save commands arrive through a JetStream ordered consumer on the checkpoint service's stream when that
stream exists: it is ephemeral (nothing to clean up when the pod dies), starts at the time this process
started (so a request sent while the trainer was still connecting or restoring is not lost, and one meant
for a previous incarnation is not replayed), and resumes from the last sequence seen after a reconnect,
where a core subscription would silently miss what was published while it was away. Without the stream
(no checkpoint service deployed) it falls back to a core NATS subscription, which sees the same
publications live. Reports go through JetStream when a stream captures them (acknowledged, deduplicated by
`Nats-Msg-Id`) and through core NATS otherwise.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit, urlunsplit

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import NoStreamResponseError, NotFoundError

from tessera.contracts import subjects
from tessera.contracts.envelope import EnvelopeError, decode, encode
from tessera.contracts.events import ReportCheckpoint, SaveCheckpoint

log = logging.getLogger(__name__)
#: NATS errors are logged as warnings at most this often, the rest at DEBUG
WARN_EVERY_S = 30.0
_REPORT_NS = uuid.UUID("6c3f0a52-8d7e-4f4b-9b55-7d2f6f0b1c11")


def report_id(report: ReportCheckpoint, checkpoint_id: str) -> str:
    """The same report (job, checkpoint, request) always gets the same id, so a resend is deduplicated."""
    return str(
        uuid.uuid5(_REPORT_NS, f"{report.job_id}/{checkpoint_id}/{report.request_id or ''}/{report.outcome}")
    )


def without_credentials(url: str) -> str:
    """``url`` as it may be logged: each server of a comma-separated list without ``user:password@``."""
    return ",".join(
        urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        for parts in (urlsplit(one.strip()) for one in url.split(","))
    )


class NatsLink:
    def __init__(
        self,
        url: str,
        job_id: str,
        on_request: Callable[[SaveCheckpoint], None],
        *,
        source: str,
        started_at: datetime | None = None,
        publish_attempts: int = 5,
        subject: str | None = None,
    ) -> None:
        self.url = url
        self.job_id = job_id
        self.subject = subject or subjects.save_checkpoint(job_id)
        self.source = source
        self.mode = ""  # "jetstream" or "core" once subscribed
        self.ready = threading.Event()
        self._on_request = on_request
        self._started_at = started_at or datetime.now(UTC)
        self._attempts = publish_attempts
        self._loop: asyncio.AbstractEventLoop | None = None
        self._nc: Client | None = None
        self._stop: asyncio.Event | None = None
        self._loop_ready = threading.Event()
        self._pending: set[concurrent.futures.Future[None]] = set()
        self._lock = threading.Lock()
        self._last_warning = -WARN_EVERY_S
        self._thread = threading.Thread(target=self._run, name=f"tessera-ckpt-nats-{job_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._loop_ready.wait(5)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:
            log.exception("checkpoint NATS link stopped")

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._loop_ready.set()
        nc = await self._connect()
        if nc is None:
            return
        try:
            await self._subscribe(nc)
            self.ready.set()
            await self._stop.wait()
            await self._drain_reports()
        finally:
            with contextlib.suppress(Exception):
                await nc.drain()

    async def _connect(self) -> Client | None:
        """Keeps trying until it connects or is closed: a NATS outage never stops the training."""
        assert self._stop is not None
        delay = 0.5
        while not self._stop.is_set():
            connecting = asyncio.ensure_future(
                nats.connect(
                    self.url,
                    name=f"tessera-checkpoint-client/{self.job_id}",
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=1,
                    connect_timeout=2,
                    allow_reconnect=True,
                    error_cb=self._on_error,
                )
            )
            stopping = asyncio.ensure_future(self._stop.wait())
            await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not connecting.done():  # closed while NATS cannot be reached (nats.py retries for ever)
                connecting.cancel()
                with contextlib.suppress(BaseException):
                    await connecting
                return None
            try:
                return connecting.result()
            except Exception as exc:
                log.warning(
                    "checkpoint client cannot reach NATS at %s (%s); retrying in %.1fs",
                    without_credentials(self.url),
                    exc,
                    delay,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
                delay = min(delay * 2, 30.0)
        return None

    async def _on_error(self, exc: Exception) -> None:
        # nats.py retries a first connection for ever and tells only this callback: say so, now and then
        now = time.monotonic()
        if now - self._last_warning >= WARN_EVERY_S:
            self._last_warning = now
            log.warning(
                "checkpoint client: NATS at %s: %s: %s (retrying)",
                without_credentials(self.url),
                type(exc).__name__,
                exc,
            )
        else:
            log.debug("checkpoint client NATS error: %s", exc)

    async def _subscribe(self, nc: Client) -> None:
        self._nc = nc
        js = nc.jetstream()
        try:
            config = api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.BY_START_TIME,
                opt_start_time=self._started_at - timedelta(seconds=1),
            )
            await js.subscribe(
                self.subject, cb=self._on_msg, ordered_consumer=True, config=config, idle_heartbeat=5
            )
            self.mode = "jetstream"
        except NotFoundError:
            await nc.subscribe(self.subject, cb=self._on_msg)
            await nc.flush(timeout=5)  # the server knows the subscription before we say we listen
            self.mode = "core"
        log.info("checkpoint client listens on %s (%s)", self.subject, self.mode)

    async def _on_msg(self, msg: Msg) -> None:
        try:
            envelope = decode(msg.subject, msg.headers, msg.data)
            command = envelope.parse()
        except EnvelopeError as exc:
            log.warning("ignored an undecodable message on %s: %s", msg.subject, exc)
            return
        if not isinstance(command, SaveCheckpoint) or command.job_id != self.job_id:
            log.warning(
                "ignored %s on %s: not a save_checkpoint for job %s", envelope.type, msg.subject, self.job_id
            )
            return
        try:
            self._on_request(command)
        except Exception:
            log.exception("save request %s could not be taken", command.request_id)

    def report(self, report: ReportCheckpoint, checkpoint_id: str) -> None:
        """Publish from any thread; never blocks. Dropped (logged) when the link is closed."""
        loop = self._loop
        if loop is None or loop.is_closed():
            log.warning("checkpoint report for step %s not sent: NATS link is not running", report.step)
            return
        try:
            fut = asyncio.run_coroutine_threadsafe(self._publish(report, checkpoint_id), loop)
        except RuntimeError:
            log.warning("checkpoint report for step %s not sent: NATS link is closed", report.step)
            return
        with self._lock:
            self._pending.add(fut)
        fut.add_done_callback(self._done)

    def _done(self, fut: concurrent.futures.Future[None]) -> None:
        with self._lock:
            self._pending.discard(fut)

    async def _publish(self, report: ReportCheckpoint, checkpoint_id: str) -> None:
        subject, headers, body = encode(report, self.source, event_id=report_id(report, checkpoint_id))
        nc = self._nc
        delay = 0.5
        for attempt in range(1, self._attempts + 1):
            if nc is None:
                await asyncio.sleep(delay)
                nc = self._nc
                continue
            try:
                try:
                    await nc.jetstream().publish(subject, body, headers=headers, timeout=5)
                except NoStreamResponseError:  # no stream captures reports: core NATS, live listeners only
                    await nc.publish(subject, body, headers=headers)
                    await nc.flush(timeout=5)
                log.info("reported checkpoint step %s (%s) on %s", report.step, report.outcome, subject)
                return
            except Exception as exc:
                log.warning("report of step %s not published (attempt %d): %s", report.step, attempt, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        log.error("gave up reporting checkpoint step %s of job %s", report.step, self.job_id)

    async def _drain_reports(self) -> None:
        with self._lock:
            pending = list(self._pending)
        if pending:
            await asyncio.wait([asyncio.wrap_future(f) for f in pending], timeout=10)

    def close(self, timeout: float = 15.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout)

    def __repr__(self) -> str:
        return f"NatsLink({without_credentials(self.url)!r}, {self.subject!r}, mode={self.mode!r})"
