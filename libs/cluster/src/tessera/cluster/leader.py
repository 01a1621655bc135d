"""Leader election on a Lease, as client-go's ``leaderelection`` does it for kube-scheduler.

Candidates share one lock (a ``coordination.k8s.io/v1`` Lease: :class:`~tessera.cluster.kube.lease.
KubernetesLeaseLock`). Every ``retry_period_s`` each tries to acquire or renew it:

- a lease nobody holds (absent, released, or held by someone whose lease has expired) is taken;
- a lease held by another is left alone until ``lease_duration_s`` has passed since *this* candidate
  last saw it change: the time is measured on the local monotonic clock, never by comparing the
  holder's timestamps with ours, so skewed clocks do not matter;
- every write carries the resourceVersion read, so of two candidates racing, one gets a conflict.

The leader renews every ``retry_period_s``; if no renewal succeeds for ``renew_deadline_s`` (counted
from when the last successful renewal was sent) it stops leading: ``lost`` is set and its work, if it
has not returned, is cancelled then, before anyone else can take over, which happens at the earliest
``lease_duration_s`` after its last renewal. kube-scheduler's defaults are 15 s, 10 s
and 2 s. On a clean stop the leader releases the lease (empty holder), so a follower takes over at
its next retry instead of after the lease duration.

Unlike kube-scheduler, which exits when it loses the lease, :meth:`LeaderElector.run` goes back to
being a candidate: the work it ran is expected to rebuild its state when it leads again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from tessera.cluster.port import ClusterError, Conflict, NotFound

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
JITTER = 1.2
"""Retries wait ``retry_period_s`` times a random factor in [1, JITTER), as client-go's JitterFactor."""


@dataclass(frozen=True)
class LeaseRecord:
    """What a Lease says (its ``spec``), and the resourceVersion it was read at."""

    holder: str | None
    lease_duration_s: float
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    transitions: int = 0
    resource_version: str | None = None


class LeaseLock(Protocol):
    """Where the lease is kept. ``create`` and ``update`` raise ``Conflict`` when the lease exists
    already / was written since it was read; ``update`` writes exactly the version read."""

    async def get(self) -> LeaseRecord | None: ...

    async def create(self, record: LeaseRecord) -> LeaseRecord: ...

    async def update(self, record: LeaseRecord) -> LeaseRecord: ...


@dataclass(frozen=True)
class LeaderElectionConfig:
    lease_duration_s: float = 15.0
    """How long followers wait, after they last saw the lease renewed, before they take it."""
    renew_deadline_s: float = 10.0
    """How long the leader keeps trying to renew before it stops leading."""
    retry_period_s: float = 2.0
    """How often candidates try to take the lease and the leader renews it."""

    def __post_init__(self) -> None:
        if self.retry_period_s <= 0:
            raise ValueError("retry_period_s must be positive")
        if self.renew_deadline_s <= JITTER * self.retry_period_s:
            raise ValueError(
                f"renew_deadline_s ({self.renew_deadline_s:g}) must exceed {JITTER:g} x retry_period_s "
                f"({self.retry_period_s:g}): the leader needs more than one try to renew"
            )
        if self.lease_duration_s <= self.renew_deadline_s:
            raise ValueError(
                f"lease_duration_s ({self.lease_duration_s:g}) must exceed renew_deadline_s "
                f"({self.renew_deadline_s:g}): a leader must stop before another may take over"
            )


def default_identity() -> str:
    """This candidate's identity: the pod's name (its hostname in a pod) and a random suffix, so a
    restarted process is a new candidate, as kube-scheduler's ``hostname_uuid``."""
    name = os.environ.get("POD_NAME") or socket.gethostname() or "tessera"
    return f"{name}_{uuid.uuid4().hex[:10]}"


def pod_namespace(default: str) -> str:
    """The namespace this pod runs in (its service account's), else ``default`` outside a pod."""
    try:
        found = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    except OSError:
        return default
    return found or default


Lead = Callable[[asyncio.Event], Awaitable[None]]
"""The leader's work: runs while this candidate leads and returns soon after its argument is set."""


class LeaderElector:
    def __init__(
        self,
        lock: LeaseLock,
        identity: str,
        config: LeaderElectionConfig = LeaderElectionConfig(),
        *,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        name: str = "",
    ) -> None:
        self.lock = lock
        self.identity = identity
        self.config = config
        self.name = name or str(lock)
        self._clock = clock
        self._now = now
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None
        self.leading = False
        self.transitions = 0
        """How many times this candidate became the leader."""

    @property
    def leader(self) -> str | None:
        """The holder this candidate last saw (itself when leading)."""
        return self._observed.holder if self._observed is not None else None

    # -- the loop ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, lead: Lead) -> None:
        """Until ``stop``: become the leader, run ``lead`` while leading, and contend again when the
        lease is lost. On stop the lease is released if held."""
        try:
            while not stop.is_set():
                if not await self._acquire(stop):
                    return
                await self._lead(stop, lead)
        finally:
            if self.leading:
                self.leading = False
            await self.release()

    async def _acquire(self, stop: asyncio.Event) -> bool:
        while not stop.is_set():
            # Bounded like a renewal: an answer that comes back after the renew deadline counted from
            # the request would have to be given up at once anyway.
            sent = await self._try_once(self.config.renew_deadline_s)
            if sent is not None:
                self._renewed_at = sent
                self.leading = True
                self.transitions += 1
                log.info("became the leader", extra={"lease": self.name, "identity": self.identity})
                return True
            await _wait(stop, self._retry_delay())
        return False

    async def _lead(self, stop: asyncio.Event, lead: Lead) -> None:
        lost = asyncio.Event()
        work = asyncio.ensure_future(lead(lost))
        renew = asyncio.ensure_future(self._keep_renewing(stop, lost))
        try:
            await asyncio.wait({work, renew}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.set()  # stopping, lost, or the work ended on its own: it leads no more
            renew.cancel()
            try:
                with contextlib.suppress(asyncio.CancelledError):
                    await renew  # raises what renewing raised unexpectedly: the work stops all the same
            finally:
                await self._finish(work)
                self.leading = False
        if not stop.is_set():
            log.warning(
                "stopped leading; contending again", extra={"lease": self.name, "identity": self.identity}
            )
            await self.release()  # if the lease is still ours (the work ended on its own): hand it on

    async def _finish(self, work: asyncio.Future[None]) -> None:
        """Wait for the leader's work to stop; it is cancelled at the renew deadline counted from the
        last successful renewal's send (at once if that has passed or another holds the lease), as
        client-go gives up leading then: another candidate may take the lease only a lease duration
        after that renewal, so the work has stopped by then."""
        left = 0.0
        if self._renewed_at is not None and self._holds():
            left = self.config.renew_deadline_s - (self._clock() - self._renewed_at)
        done, _ = await asyncio.wait({work}, timeout=max(left, 0.0))
        if not done:
            log.error("the leader's work did not stop when asked; cancelling it", extra={"lease": self.name})
            work.cancel()
        try:
            await work
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("the leader's work failed", extra={"lease": self.name})

    async def _keep_renewing(self, stop: asyncio.Event, lost: asyncio.Event) -> None:
        # The renew deadline runs from when the last successful write was *sent*, as in client-go: the
        # server may have stored it at any instant up to the answer, and the followers count the
        # lease duration from when they saw it, which can be long before the answer came back here.
        renewed = self._renewed_at if self._renewed_at is not None else self._clock()
        deadline = self.config.renew_deadline_s
        while not stop.is_set():
            left = deadline - (self._clock() - renewed)
            if await _wait(stop, min(self.config.retry_period_s, max(left, 0.0))):
                return
            left = deadline - (self._clock() - renewed)
            if left > 0 and (sent := await self._try_once(left)) is not None:
                renewed = self._renewed_at = sent
                continue
            if self._clock() - renewed >= deadline or not self._holds():
                log.error(
                    "lost the lease: not renewed within the renew deadline"
                    if self._holds()
                    else "lost the lease: another candidate holds it",
                    extra={"lease": self.name, "identity": self.identity, "holder": self.leader},
                )
                lost.set()
                return

    def _holds(self) -> bool:
        return self._observed is not None and self._observed.holder == self.identity

    def _retry_delay(self) -> float:
        return self.config.retry_period_s * random.uniform(1.0, JITTER)

    # -- one try -------------------------------------------------------------------------------

    async def _try_once(self, timeout: float) -> float | None:
        """One bounded try; on success, the clock's time when it began (before any request was sent)."""
        sent = self._clock()
        try:
            held = await asyncio.wait_for(self.try_acquire_or_renew(), timeout=max(timeout, 0.05))
        except (TimeoutError, ClusterError, OSError) as error:
            log.info(
                "could not read or write the lease",
                extra={"lease": self.name, "error": str(error) or "timeout"},
            )
            return None
        return sent if held else None

    async def try_acquire_or_renew(self) -> bool:
        """One round of client-go's ``tryAcquireOrRenew``: True when this candidate holds the lease."""
        now = self._now()
        duration = self.config.lease_duration_s
        current = await self.lock.get()
        if current is None:
            fresh = LeaseRecord(self.identity, duration, now, now, 0)
            try:
                self._observe(await self.lock.create(fresh))
            except Conflict:
                return False
            return True
        if current != self._observed:
            self._observe(current)
        mine = current.holder == self.identity
        held = bool(current.holder) and not mine
        if held and self._observed_at + current.lease_duration_s > self._clock():
            return False  # another candidate leads and its lease has not run out here
        if mine:
            wanted = replace(current, lease_duration_s=duration, renew_time=now)
        else:
            wanted = replace(
                current,
                holder=self.identity,
                lease_duration_s=duration,
                acquire_time=now,
                renew_time=now,
                transitions=current.transitions + 1,
            )
        try:
            self._observe(await self.lock.update(wanted))
        except Conflict:
            return False
        return True

    async def release(self) -> None:
        """Give the lease up if this candidate holds it: an empty holder lets a follower take it at
        its next retry. The write has the renew deadline to land, as client-go's release: the work
        has already stopped, so a slow answer costs only shutdown time, while giving up early leaves
        the followers waiting a whole lease duration. Within it the write is tried again: after a
        timeout or an error, and after a conflict when the lease read back is still this
        candidate's (a renewal cancelled or timed out after the server stored it leaves the version
        seen here one behind)."""
        if not self._holds() or self._observed is None:
            return
        loop = asyncio.get_running_loop()  # a bound on waiting, so the loop's time, as wait_for's
        deadline = loop.time() + self.config.renew_deadline_s
        error: Exception | None = None
        while (left := deadline - loop.time()) > 0:
            try:
                await asyncio.wait_for(self._release_once(), timeout=left)
            except NotFound:
                log.info("the lease is gone: nothing to release", extra={"lease": self.name})
                self._observed = None
                return
            except Conflict as conflict:
                error = conflict
                if not await self._still_mine(deadline):
                    log.info(
                        "the lease is no longer this candidate's: nothing to release",
                        extra={"lease": self.name, "holder": self.leader},
                    )
                    return
            except (TimeoutError, ClusterError, OSError) as failed:
                error = failed
            else:
                log.info("released the lease", extra={"lease": self.name, "identity": self.identity})
                return
            # never back to back: a failing API server is not asked again at once
            await asyncio.sleep(min(self.config.retry_period_s / 4, max(deadline - loop.time(), 0.0)))
        log.warning(
            "could not release the lease",
            extra={"lease": self.name, "error": (str(error) if error else "") or "timeout"},
        )

    async def _release_once(self) -> None:
        assert self._observed is not None
        now = self._now()
        released = replace(
            self._observed, holder=None, lease_duration_s=1.0, acquire_time=now, renew_time=now
        )
        self._observe(await self.lock.update(released))

    async def _still_mine(self, deadline: float) -> bool:
        """After a conflict: read the lease again; True when it is still this candidate's (and the
        next write carries its version), False when another holds it or nobody does."""
        try:
            left = deadline - asyncio.get_running_loop().time()
            current = await asyncio.wait_for(self.lock.get(), timeout=max(left, 0.05))
        except (TimeoutError, ClusterError, OSError):
            return True  # unknown: try the write again (after a pause) while the deadline lasts
        if current is None or current.holder != self.identity:
            if current is None:
                self._observed = None
            else:
                self._observe(current)
            return False
        self._observe(current)
        return True

    def _observe(self, record: LeaseRecord) -> None:
        self._observed = record
        self._observed_at = self._clock()


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` or until ``stop``; True when stopped."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    return stop.is_set()
