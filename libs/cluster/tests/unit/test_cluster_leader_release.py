"""Releasing the lease on stop when the API server misbehaves: a renewal whose answer was lost, a lease
another has taken, a deleted lease, and conflicts with a lease that cannot be read back."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from tessera.cluster.leader import LeaderElector, LeaseRecord
from tessera.cluster.port import ClusterError, Conflict, NotFound

from .test_cluster_leader_election import FAST, Candidate, MemoryLease, MemoryLeaseView, until


async def started(view_type: type[MemoryLeaseView]) -> tuple[MemoryLease, Candidate, MemoryLeaseView]:
    """A leading candidate whose lease is reached through `view_type`."""
    lease, timeline = MemoryLease(), list[tuple[str, str]]()
    a = Candidate(lease, "a", timeline)
    view = view_type(lease, a.down)
    a.elector = LeaderElector(view, "a", FAST, name="a")
    a.start()
    await until(lambda: a.elector.leading)
    return lease, a, view


class RenewalAnswerLost(MemoryLeaseView):
    """Once armed, the next renewal is stored by the server but its answer never comes back (the
    request timed out or was cancelled as the leader stopped): the version seen by the leader is
    then one behind the lease's."""

    armed = False

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        stored = await super().update(record)
        if self.armed and record.holder is not None:
            self.armed = False
            raise ClusterError("timed out waiting for the answer")
        return stored


async def test_a_release_after_a_renewal_whose_answer_was_lost_still_lands() -> None:
    lease, a, view = await started(RenewalAnswerLost)
    view.armed = True
    await until(lambda: not view.armed)  # the renewal landed; the leader never saw it
    a.stop.set()
    assert a.task is not None
    await asyncio.wait_for(a.task, 5)
    assert lease.record is not None and lease.record.holder is None, "a released the lease"
    assert lease.writes[-1] is None


class HeldByAnotherAfterConflict(MemoryLeaseView):
    """The release meets a lease another candidate has taken meanwhile: it is not written over."""

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        if record.holder is None and self.lease.record is not None:
            self.lease.record = replace(self.lease.record, holder="b", resource_version="taken")
        return await super().update(record)


async def test_a_release_never_overwrites_a_lease_another_has_taken() -> None:
    lease, a, _ = await started(HeldByAnotherAfterConflict)
    await a.stopped()
    assert lease.record is not None and lease.record.holder == "b"
    assert a.elector.leader == "b"


class DeletedOnStop(MemoryLeaseView):
    """The lease is deleted before the release: the API server answers 404."""

    updates = 0

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        if record.holder is None:
            self.updates += 1
            raise NotFound("leases.coordination.k8s.io not found")
        return await super().update(record)


async def test_a_release_of_a_deleted_lease_stops_at_once() -> None:
    _, a, view = await started(DeletedOnStop)
    await a.stopped()
    assert view.updates == 1 and a.elector.leader is None


class StaleAndUnreadable(MemoryLeaseView):
    """Every release meets a conflict and every read back fails (an overloaded API server)."""

    calls = 0

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        if record.holder is None:
            self.calls += 1
            raise Conflict("the object has been modified")
        return await super().update(record)

    async def get(self) -> LeaseRecord | None:
        if self.calls:
            self.calls += 1
            raise ClusterError("429 too many requests")
        return await super().get()


async def test_a_release_that_keeps_failing_pauses_between_tries_and_ends_at_the_deadline() -> None:
    _, a, view = await started(StaleAndUnreadable)
    await a.stopped()
    # a write and a read per try, a pause of a quarter retry period between tries, for the deadline
    tries = FAST.renew_deadline_s / (FAST.retry_period_s / 4)
    assert 2 <= view.calls <= 2 * (tries + 1)
