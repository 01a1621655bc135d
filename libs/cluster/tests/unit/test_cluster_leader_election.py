"""Leader election on a lease kept in memory: one leader at a time, a clean handover on stop, a
takeover after the lease runs out when the leader vanishes, a leader that cannot renew stops first."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from tessera.cluster.leader import LeaderElectionConfig, LeaderElector, LeaseRecord, default_identity
from tessera.cluster.leader_settings import LeaderElectionSettings
from tessera.cluster.port import ClusterError, Conflict

FAST = LeaderElectionConfig(lease_duration_s=0.6, renew_deadline_s=0.4, retry_period_s=0.1)


class MemoryLease:
    """A lease with the API server's rules: create fails if it exists, update needs the version read.
    ``down`` makes every call of one candidate fail, as if it lost the API server."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0
        self.writes: list[str | None] = []

    def view(self, down: list[bool] | None = None) -> MemoryLeaseView:
        return MemoryLeaseView(self, down if down is not None else [False])


class MemoryLeaseView:
    def __init__(self, lease: MemoryLease, down: list[bool]) -> None:
        self.lease = lease
        self.down = down

    def _check(self) -> None:
        if self.down[0]:
            raise ClusterError("the API server does not answer")

    async def get(self) -> LeaseRecord | None:
        self._check()
        return self.lease.record

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        self._check()
        if self.lease.record is not None:
            raise Conflict("leases.coordination.k8s.io already exists")
        return self._store(record)

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        self._check()
        if self.lease.record is None or record.resource_version != self.lease.record.resource_version:
            raise Conflict("the object has been modified")
        return self._store(record)

    def _store(self, record: LeaseRecord) -> LeaseRecord:
        self.lease.version += 1
        self.lease.record = replace(record, resource_version=str(self.lease.version))
        self.lease.writes.append(record.holder)
        return self.lease.record


class Candidate:
    """An elector running in the background, with a log of when its work led."""

    def __init__(
        self,
        lease: MemoryLease,
        name: str,
        timeline: list[tuple[str, str]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.down = [False]
        self.elector = LeaderElector(lease.view(self.down), name, FAST, clock=clock, name=name)
        self.stop = asyncio.Event()
        self.name = name
        self.timeline = timeline
        self.task: asyncio.Task[None] | None = None

    async def lead(self, lost: asyncio.Event) -> None:
        self.timeline.append((self.name, "start"))
        try:
            await lost.wait()
        finally:
            self.timeline.append((self.name, "stop"))

    def start(self) -> Candidate:
        self.task = asyncio.ensure_future(self.elector.run(self.stop, self.lead))
        return self

    async def stopped(self) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 5)

    async def killed(self) -> None:
        """Gone without a word: no release."""
        assert self.task is not None
        self.down[0] = True
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


def leading(timeline: list[tuple[str, str]]) -> list[str]:
    """Who leads after each entry; fails if two ever lead at once."""
    now: set[str] = set()
    history = []
    for name, what in timeline:
        if what == "start":
            now.add(name)
        else:
            now.discard(name)
        assert len(now) <= 1, f"two leaders at once: {timeline}"
        history.append(",".join(sorted(now)))
    return history


async def until(probe: object, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not probe():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_one_leads_and_a_clean_stop_hands_over_at_the_next_retry() -> None:
    lease, timeline = MemoryLease(), []  # type: list[tuple[str, str]]
    a = Candidate(lease, "a", timeline).start()
    await until(lambda: a.elector.leading)
    # b's clock stands still: a lease it saw held never runs out for b, so b can only take over a
    # lease that a released, not one that expired
    b = Candidate(lease, "b", timeline, clock=lambda: 0.0).start()
    await asyncio.sleep(3 * FAST.lease_duration_s)  # b keeps seeing a renew: it never takes over
    assert a.elector.leading and not b.elector.leading and b.elector.leader == "a"
    assert lease.record is not None and lease.record.transitions == 0

    await a.stopped()
    assert lease.record.holder is None, "a released the lease"
    await until(lambda: b.elector.leading)  # without waiting for the lease to run out
    assert lease.record.holder == "b" and lease.record.transitions == 1
    await b.stopped()
    assert leading(timeline) == ["a", "", "b", ""]


async def test_a_vanished_leader_is_replaced_once_its_lease_runs_out() -> None:
    lease, timeline = MemoryLease(), []  # type: list[tuple[str, str]]
    a = Candidate(lease, "a", timeline).start()
    await until(lambda: a.elector.leading)
    b = Candidate(lease, "b", timeline).start()
    await asyncio.sleep(0.2)
    killed_at = asyncio.get_running_loop().time()
    await a.killed()
    await until(lambda: b.elector.leading)
    took = asyncio.get_running_loop().time() - killed_at
    # never before the lease ran out: b last saw it renewed up to a retry (and its jitter) before a
    # vanished (a lower bound only; how much later depends on the machine)
    assert took >= FAST.lease_duration_s - 2 * FAST.retry_period_s, took
    await b.stopped()
    assert [name for name, what in timeline if what == "start"] == ["a", "b"]


async def test_a_leader_that_cannot_renew_stops_before_another_takes_over() -> None:
    lease, timeline = MemoryLease(), []  # type: list[tuple[str, str]]
    a = Candidate(lease, "a", timeline).start()
    await until(lambda: a.elector.leading)
    b = Candidate(lease, "b", timeline).start()
    await asyncio.sleep(0.2)
    a.down[0] = True  # a is cut off from the API server; its process lives on
    await until(lambda: b.elector.leading)
    assert not a.elector.leading
    # a's work stopped before b's started: the timeline never shows both
    assert leading(timeline)[-2:] == ["", "b"]
    a.down[0] = False  # back: a is a follower now, and stays one
    await asyncio.sleep(3 * FAST.retry_period_s)
    assert b.elector.leading and not a.elector.leading and a.elector.leader == "b"
    await a.stopped()
    await b.stopped()


async def test_two_candidates_racing_for_a_new_lease_elect_one() -> None:
    lease = MemoryLease()
    electors = [LeaderElector(lease.view(), name, FAST) for name in ("a", "b", "c")]
    won = await asyncio.gather(*(e.try_acquire_or_renew() for e in electors))
    assert sum(won) == 1
    assert lease.record is not None and lease.record.holder == ["a", "b", "c"][won.index(True)]


async def test_a_fresh_lease_of_another_is_not_taken_and_an_expired_one_is() -> None:
    lease = MemoryLease()
    earlier = datetime(2026, 1, 1, tzinfo=UTC)
    await lease.view().create(LeaseRecord("other", 15.0, earlier, earlier, 3))
    now = [100.0]
    elector = LeaderElector(lease.view(), "me", LeaderElectionConfig(), clock=lambda: now[0])
    assert await elector.try_acquire_or_renew() is False
    now[0] += 14.9
    assert await elector.try_acquire_or_renew() is False
    now[0] += 0.2  # 15.1 s since it last saw the lease change, on its own clock
    assert await elector.try_acquire_or_renew() is True
    assert lease.record is not None
    assert (lease.record.holder, lease.record.transitions, lease.record.lease_duration_s) == ("me", 4, 15.0)
    acquired = lease.record.acquire_time
    now[0] += 2
    assert await elector.try_acquire_or_renew() is True  # a renewal keeps the acquire time
    assert lease.record.acquire_time == acquired and lease.record.transitions == 4


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ((15.0, 15.0, 2.0), "lease_duration_s .* must exceed renew_deadline_s"),
        ((15.0, 2.0, 2.0), "renew_deadline_s .* must exceed 1.2 x retry_period_s"),
        ((15.0, 10.0, 0.0), "retry_period_s must be positive"),
    ],
)
def test_durations_that_would_let_two_lead_are_refused(
    values: tuple[float, float, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        LeaderElectionConfig(*values)


@pytest.mark.parametrize(("lease", "deadline"), [(10.0, 10.0), (8.0, 10.0)])
def test_settings_refuse_a_renew_deadline_not_shorter_than_the_lease(lease: float, deadline: float) -> None:
    with pytest.raises(ValidationError, match=r"lease_duration_s .* must exceed renew_deadline_s"):
        LeaderElectionSettings(lease_name="tessera", lease_duration_s=lease, renew_deadline_s=deadline)
    LeaderElectionSettings(lease_name="tessera", lease_duration_s=deadline + 1, renew_deadline_s=deadline)


def test_identities_are_unique_per_process_start() -> None:
    first, second = default_identity(), default_identity()
    assert first != second and first.rsplit("_", 1)[0] == second.rsplit("_", 1)[0]


class SlowAnswers(MemoryLeaseView):
    """Writes land on the server at once, but their answers take ``delay`` to come back."""

    def __init__(self, lease: MemoryLease, down: list[bool], delay: float) -> None:
        super().__init__(lease, down)
        self.delay = delay

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        stored = await super().create(record)
        await asyncio.sleep(self.delay)
        return stored

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        stored = await super().update(record)
        await asyncio.sleep(self.delay)
        return stored


async def test_a_leader_whose_answer_came_late_counts_its_deadline_from_the_request() -> None:
    # a's write is stored at once but answered just inside the renew deadline, and a is cut off right
    # after. b saw the write straight away, so it takes over one lease duration after it; a must
    # have stopped before then, counting its renew deadline from when it sent the write.
    lease, timeline = MemoryLease(), []  # type: list[tuple[str, str]]
    down = [False]
    a = Candidate(lease, "a", timeline)
    a.down = down
    a.elector = LeaderElector(SlowAnswers(lease, down, 0.9 * FAST.renew_deadline_s), "a", FAST, name="a")
    lead_a = a.lead

    async def lead_then_cut_off(lost: asyncio.Event) -> None:
        down[0] = True
        await lead_a(lost)

    a.task = asyncio.ensure_future(a.elector.run(a.stop, lead_then_cut_off))
    await asyncio.sleep(0.02)
    b = Candidate(lease, "b", timeline).start()
    await until(lambda: b.elector.leading)
    assert leading(timeline)[-2:] == ["", "b"]  # and never two at once on the way
    down[0] = False
    await a.stopped()
    await b.stopped()


class StubbornCandidate(Candidate):
    """Its work does not heed ``lost``: only cancelling stops it."""

    async def lead(self, lost: asyncio.Event) -> None:
        self.timeline.append((self.name, "start"))
        try:
            await asyncio.Event().wait()
        finally:
            self.timeline.append((self.name, "stop"))


class CutOffAfterAcquiring(MemoryLeaseView):
    """The acquire is stored at once, its answer comes back ``late`` later on the clock ``now``, and
    then the API server is gone."""

    def __init__(self, lease: MemoryLease, now: list[float], late: float) -> None:
        super().__init__(lease, [False])
        self.now = now
        self.late = late

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        stored = await super().create(record)
        self.now[0] += self.late
        self.down[0] = True
        return stored


async def test_work_that_does_not_stop_is_cancelled_at_the_renew_deadline() -> None:
    # client-go gives up leading at the renew deadline, counted from the last successful write's
    # send; the work must not go on towards the lease duration, after which another may lead.
    config = LeaderElectionConfig(lease_duration_s=1000.0, renew_deadline_s=0.5, retry_period_s=0.125)
    now = [0.0]  # the acquire is sent at 0 and answered at 0.25; no renewal succeeds after it
    lease, timeline = MemoryLease(), list[tuple[str, str]]()
    a = StubbornCandidate(lease, "a", timeline)
    a.elector = LeaderElector(CutOffAfterAcquiring(lease, now, 0.25), "a", config, clock=lambda: now[0])
    cancelled_at: list[float] = []
    lead = a.lead

    async def work(lost: asyncio.Event) -> None:
        try:
            await lead(lost)
        except asyncio.CancelledError:
            cancelled_at.append(now[0])
            raise

    a.task = asyncio.ensure_future(a.elector.run(a.stop, work))
    await until(lambda: timeline == [("a", "start")])
    now[0] = 0.375  # inside the renew deadline: renewals fail, the work goes on
    await asyncio.sleep(3 * config.retry_period_s)
    assert a.elector.leading and timeline == [("a", "start")]
    now[0] = 0.5  # the renew deadline since the acquire was sent
    await until(lambda: not a.elector.leading)
    assert timeline == [("a", "start"), ("a", "stop")] and cancelled_at == [0.5]
    await a.stopped()


async def test_a_leader_whose_work_does_not_stop_never_overlaps_the_next() -> None:
    lease, timeline = MemoryLease(), list[tuple[str, str]]()
    a = StubbornCandidate(lease, "a", timeline).start()
    await until(lambda: a.elector.leading)
    b = Candidate(lease, "b", timeline).start()
    await asyncio.sleep(0.2)
    a.down[0] = True  # a is cut off; its work would run on if it were not cancelled
    await until(lambda: b.elector.leading)
    assert leading(timeline)[-2:] == ["", "b"]  # and never two at once on the way
    assert not a.elector.leading
    a.down[0] = False
    await a.stopped()
    await b.stopped()


class BreaksWhenRenewing(MemoryLeaseView):
    """Acquires, then every renewal raises an error nobody expects (a bug, not the API server)."""

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        if self.lease.record is not None and self.lease.record.holder == record.holder:
            raise RuntimeError("a bug in renewing")
        return await super().update(record)


async def test_work_stops_when_renewing_fails_unexpectedly() -> None:
    # The renewal's unexpected error ends the elector; the leader's work (one that does not heed
    # `lost`) must not outlive the lease: it is cancelled at the renew deadline, as on a lost lease.
    lease, timeline = MemoryLease(), list[tuple[str, str]]()
    a = StubbornCandidate(lease, "a", timeline)
    a.elector = LeaderElector(BreaksWhenRenewing(lease, [False]), "a", FAST, name="a")
    a.start()
    assert a.task is not None
    with pytest.raises(RuntimeError, match="a bug in renewing"):
        await asyncio.wait_for(a.task, 5)
    assert timeline == [("a", "start"), ("a", "stop")]
    assert not a.elector.leading


class SlowToRelease(MemoryLeaseView):
    """The release's write takes longer than a retry period (a loaded API server) but lands well
    inside the renew deadline."""

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        if record.holder is None:
            await asyncio.sleep(2.5 * FAST.retry_period_s)
        return await super().update(record)


async def test_a_release_answered_after_a_retry_period_still_lands() -> None:
    lease, timeline = MemoryLease(), []  # type: list[tuple[str, str]]
    a = Candidate(lease, "a", timeline)
    a.elector = LeaderElector(SlowToRelease(lease, a.down), "a", FAST, name="a")
    a.start()
    await until(lambda: a.elector.leading)
    await a.stopped()
    assert lease.record is not None and lease.record.holder is None, "a released the lease"
    assert leading(timeline) == ["a", ""]
