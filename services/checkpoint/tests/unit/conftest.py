"""The checkpoint service's unit of work in memory, for handler, loop and route tests with no I/O.

The fake repositories keep the rules of the Postgres ones: one open request per job, a checkpoint
recorded once, a signal acted on once per value. Each unit works on a copy of what was committed,
and repositories hand out copies, so a change reaches the store only through `save`/`add` and a
commit; leaving without a commit drops it (and the after-commit callbacks)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any

import pytest

from tessera.checkpoint.adapters.repository import Track
from tessera.checkpoint.domain.model import Checkpoint, CheckpointRequest, Job
from tessera.checkpoint.domain.signals import NodeSignal, TerminationPolicy
from tessera.checkpoint.service_layer.dependencies import CheckpointDeps
from tessera.checkpoint.service_layer.unit_of_work import CheckpointUnitOfWork
from tessera.testing.fakes import FakeUnitOfWork

T0 = datetime(2026, 11, 24, 9, 0, tzinfo=UTC)


def _copy(aggregate: Any) -> Any:
    """A stored copy: what was recorded stays with the object the unit tracks."""
    stored = copy.deepcopy(aggregate)
    stored.events = []
    return stored


@dataclass
class Store:
    requests: dict[str, CheckpointRequest] = field(default_factory=dict)
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    jobs: dict[str, Job] = field(default_factory=dict)
    signals: dict[tuple[str, str], NodeSignal] = field(default_factory=dict)


class FakeRequests:
    def __init__(self, store: Store, track: Track) -> None:
        self.store, self.track = store, track

    async def add(self, request: CheckpointRequest) -> bool:
        taken = request.request_id in self.store.requests or any(
            r.is_open and r.job_id == request.job_id for r in self.store.requests.values()
        )
        if taken:
            return False
        self.store.requests[request.request_id] = _copy(request)
        self.track(request)
        return True

    async def get(self, request_id: str) -> CheckpointRequest | None:
        found = self.store.requests.get(request_id)
        return self._tracked(found) if found else None

    async def open_for(self, job_id: str) -> CheckpointRequest | None:
        found = [r for r in self.store.requests.values() if r.is_open and r.job_id == job_id]
        return self._tracked(found[0]) if found else None

    async def due(self, now: datetime, limit: int) -> list[CheckpointRequest]:
        due = sorted(
            (r for r in self.store.requests.values() if r.is_open and r.deadline <= now),
            key=lambda r: r.deadline,
        )
        return [self._tracked(r) for r in due[:limit]]

    async def next_deadline(self) -> datetime | None:
        return min((r.deadline for r in self.store.requests.values() if r.is_open), default=None)

    async def save(self, request: CheckpointRequest) -> None:
        assert request.request_id in self.store.requests, "save() of a request never added"
        self.store.requests[request.request_id] = _copy(request)
        self.track(request)

    def _tracked(self, stored: CheckpointRequest) -> CheckpointRequest:
        request = copy.deepcopy(stored)
        self.track(request)
        return request


class FakeCheckpoints:
    def __init__(self, store: Store, track: Track) -> None:
        self.store, self.track = store, track

    async def add(self, checkpoint: Checkpoint) -> bool:
        if checkpoint.id in self.store.checkpoints:
            return False
        self.store.checkpoints[checkpoint.id] = _copy(checkpoint)
        self.track(checkpoint)
        return True

    async def latest(self, job_id: str) -> Checkpoint | None:
        found = await self.of_job(job_id, 1)
        return found[0] if found else None

    async def of_job(self, job_id: str, limit: int) -> list[Checkpoint]:
        mine = [c for c in self.store.checkpoints.values() if c.job_id == job_id]
        return [
            copy.deepcopy(c) for c in sorted(mine, key=lambda c: (c.saved_at, c.step), reverse=True)[:limit]
        ]


class FakeJobs:
    def __init__(self, store: Store, track: Track) -> None:
        self.store, self.track = store, track

    async def get(self, job_id: str) -> Job:
        stored = self.store.jobs.setdefault(job_id, Job(job_id))
        job = copy.deepcopy(stored)
        self.track(job)
        return job

    async def on_node(self, node: str) -> list[Job]:
        found = [
            copy.deepcopy(j) for _, j in sorted(self.store.jobs.items()) if not j.finished and node in j.nodes
        ]
        for job in found:
            self.track(job)
        return found

    async def save(self, job: Job) -> None:
        self.store.jobs[job.job_id] = _copy(job)
        self.track(job)


class FakeSignals:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def note(self, signal: NodeSignal) -> bool:
        known = self.store.signals.get((signal.node, signal.key))
        if known is not None and known.value == signal.value:
            return False
        self.store.signals[(signal.node, signal.key)] = signal
        return True

    async def keep_only(self, node: str, keys: Collection[str]) -> None:
        self.store.signals = {k: s for k, s in self.store.signals.items() if k[0] != node or k[1] in keys}


class FakeCheckpointUnitOfWork(FakeUnitOfWork, CheckpointUnitOfWork):
    """`stored` is what committed units left; the open unit's repositories work on a copy of it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stored = Store()
        self._on_commit = []
        self.commit_failures: list[Exception] = []
        """Raised by the next commits, in order (the database restarting, say)."""

    def open_repositories(self, session: object) -> None:
        self._on_commit = []
        self._working = copy.deepcopy(self.stored)
        self.requests = FakeRequests(self._working, self.track)
        self.checkpoints = FakeCheckpoints(self._working, self.track)
        self.jobs = FakeJobs(self._working, self.track)
        self.signals = FakeSignals(self._working)

    async def commit(self) -> None:
        if self.commit_failures:
            raise self.commit_failures.pop(0)
        await super().commit()
        self.stored = self._working
        self.run_commit_callbacks()
        self.open_repositories(None)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await super().__aexit__(exc_type, exc, tb)
        self._on_commit = []


class Clock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


@pytest.fixture
def uow() -> FakeCheckpointUnitOfWork:
    return FakeCheckpointUnitOfWork()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def policy() -> TerminationPolicy:
    return TerminationPolicy(
        taints={
            "aws-node-termination-handler/spot-itn": "spot_interruption",
            "karpenter.sh/disrupted": "node_termination",
        },
        labels={},
        deadline_annotations=["tessera.io/termination-deadline"],
        notice=timedelta(seconds=30),
    )


@pytest.fixture
def deps(uow: FakeCheckpointUnitOfWork, clock: Clock, policy: TerminationPolicy) -> CheckpointDeps:
    return CheckpointDeps(
        uow=lambda: uow,
        stop=asyncio.Event(),
        termination=policy,
        nodes=None,
        deadline_poll_s=0.05,
        clock=clock,
    )
