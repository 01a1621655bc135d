"""Nodes about to go and requests past their deadline, through the service layer and its loops on
in-memory repositories: each signal asks each checkpointable job once, each deadline ends a request once."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from tessera.checkpoint.domain.model import Job, RequestState
from tessera.checkpoint.domain.signals import NodeState, TerminationPolicy
from tessera.checkpoint.entrypoints.loops import time_out_requests, watch_nodes
from tessera.checkpoint.service_layer.deadlines import expire_overdue
from tessera.checkpoint.service_layer.dependencies import CheckpointDeps
from tessera.checkpoint.service_layer.spot import reconcile_nodes
from tessera.contracts.events import CheckpointFailed, ReadyForEviction, SaveCheckpoint
from tessera.testing.services import eventually

SPOT = "aws-node-termination-handler/spot-itn"


def tainted(name: str = "n0", value: str = "evt-1", **annotations: str) -> NodeState:
    return NodeState(name, taints={SPOT: value}, annotations=annotations)


def seed_jobs(uow: Any, **jobs: tuple[bool | None, str]) -> None:
    """job id -> (checkpointable, node of its one pod), as admission and the scheduler told."""
    for job_id, (checkpointable, node) in jobs.items():
        uow.stored.jobs[job_id] = Job(job_id, checkpointable, pods={f"{job_id}-0": node})


async def reconcile(
    uow: Any, policy: TerminationPolicy, clock: Any, nodes: Mapping[str, NodeState | None]
) -> None:
    async with uow:
        await reconcile_nodes(uow, nodes, policy, clock())
        await uow.commit()


async def test_each_checkpointable_job_on_a_tainted_node_is_asked_once(
    uow: Any, policy: TerminationPolicy, clock: Any
) -> None:
    seed_jobs(uow, a=(True, "n0"), b=(False, "n0"), c=(None, "n0"), d=(True, "n1"))
    await reconcile(uow, policy, clock, {"n0": tainted(), "n1": NodeState("n1")})
    assert [(c.job_id, c.reason, c.deadline) for c in uow.events_of(SaveCheckpoint)] == [
        ("a", "spot_interruption", clock() + timedelta(seconds=30))
    ]
    for _ in range(2):  # seen again: a resync, a restart relisting every node
        await reconcile(uow, policy, clock, {"n0": tainted()})
    assert len(uow.events_of(SaveCheckpoint)) == 1


async def test_a_new_signal_on_the_node_asks_again_once_the_first_request_ended(
    uow: Any, policy: TerminationPolicy, clock: Any
) -> None:
    seed_jobs(uow, a=(True, "n0"))
    await reconcile(uow, policy, clock, {"n0": tainted(value="evt-1")})
    async with uow:
        await expire_overdue(uow, clock.advance(30))
        await uow.commit()
    await reconcile(uow, policy, clock, {"n0": tainted(value="evt-2")})
    assert len(uow.events_of(SaveCheckpoint)) == 2
    await reconcile(uow, policy, clock, {"n0": NodeState("n0")})  # the taint is gone
    assert uow.stored.signals == {}
    await reconcile(uow, policy, clock, {"n0": tainted(value="evt-2")})  # and back: a new episode
    assert len(uow.events_of(SaveCheckpoint)) == 2, "the second request is still open"


async def test_a_job_already_asked_keeps_its_request_with_the_earlier_deadline(
    uow: Any, policy: TerminationPolicy, clock: Any
) -> None:
    seed_jobs(uow, a=(True, "n0"))
    soon = (clock() + timedelta(seconds=10)).isoformat()
    await reconcile(uow, policy, clock, {"n0": tainted()})
    await reconcile(
        uow,
        policy,
        clock,
        {
            "n0": NodeState(
                "n0",
                taints={"karpenter.sh/disrupted": ""},
                annotations={"tessera.io/termination-deadline": soon},
            )
        },
    )
    assert len(uow.events_of(SaveCheckpoint)) == 1
    [request] = uow.stored.requests.values()
    assert request.deadline == clock() + timedelta(seconds=10)


async def test_a_node_already_past_its_deadline_lets_the_eviction_go_now(
    uow: Any, policy: TerminationPolicy, clock: Any
) -> None:
    seed_jobs(uow, a=(True, "n0"))
    past = (clock() - timedelta(seconds=1)).isoformat()
    await reconcile(uow, policy, clock, {"n0": tainted(**{"tessera.io/termination-deadline": past})})
    assert [(e.reason, e.cause) for e in uow.events_of(ReadyForEviction)] == [
        ("deadline_passed", "spot_interruption")
    ]
    assert uow.stored.requests == {}


async def test_a_deleted_node_forgets_its_signals(uow: Any, policy: TerminationPolicy, clock: Any) -> None:
    await reconcile(uow, policy, clock, {"n0": tainted(), "n1": tainted("n1")})
    await reconcile(uow, policy, clock, {"n0": None})
    assert list(uow.stored.signals) == [("n1", f"taint:{SPOT}")]


# -- deadlines -----------------------------------------------------------------------------------------
async def test_requests_time_out_at_their_deadline_and_once(
    uow: Any, policy: TerminationPolicy, clock: Any
) -> None:
    seed_jobs(uow, a=(True, "n0"), b=(True, "n1"))
    await reconcile(uow, policy, clock, {"n0": tainted()})
    clock.advance(10)
    await reconcile(uow, policy, clock, {"n1": tainted("n1")})
    uow.outbox.clear()
    async with uow:
        expired = await expire_overdue(uow, clock.advance(20))  # a's deadline, not b's
        await uow.commit()
    assert [r.job_id for r in expired.requests] == ["a"] and not expired.more
    assert expired.next_deadline == clock() + timedelta(seconds=10)
    assert [(type(e), e.job_id) for e in uow.outbox] == [(CheckpointFailed, "a"), (ReadyForEviction, "a")]
    async with uow:
        again = await expire_overdue(uow, clock())
        await uow.commit()
    assert again.requests == [] and len(uow.outbox) == 2


async def test_the_deadline_loop_wakes_for_a_new_request_and_ends_it_at_its_deadline(
    deps: CheckpointDeps, uow: Any, clock: Any
) -> None:
    loop = asyncio.create_task(time_out_requests(deps))
    try:
        seed_jobs(uow, a=(True, "n0"))
        await reconcile(uow, deps.termination, clock, {"n0": tainted()})
        deps.deadline_wake.set()
        await asyncio.sleep(0.1)
        assert uow.events_of(ReadyForEviction) == [], "not before its deadline"
        clock.advance(30)
        await eventually(lambda: _value(uow.events_of(ReadyForEviction)), what="the timeout", timeout=5)
        assert (
            uow.stored.requests[uow.events_of(SaveCheckpoint)[0].request_id].state is RequestState.TIMED_OUT
        )
    finally:
        deps.stop.set()
        await asyncio.wait_for(loop, 5)


class FakeNodeWatch:
    def __init__(self, nodes: dict[str, NodeState | None]) -> None:
        self.changed = asyncio.Event()
        self.pending = dict(nodes)
        self.started = self.stopped = False
        self.retried: list[set[str]] = []

    async def start(self) -> None:
        self.started = True
        self.changed.set()

    async def stop(self) -> None:
        self.stopped = True

    def take(self) -> Mapping[str, NodeState | None]:
        taken, self.pending = self.pending, {}
        self.changed.clear()
        return taken

    def retry(self, names: set[str]) -> None:
        self.retried.append(names)
        self.pending.update({name: tainted(name) for name in names})
        self.changed.set()


async def test_the_node_loop_retries_what_failed_and_wakes_the_deadline_loop(
    deps: CheckpointDeps, uow: Any
) -> None:
    seed_jobs(uow, a=(True, "n0"))
    watch = FakeNodeWatch({"n0": tainted()})
    deps.nodes = watch
    uow.commit_failures.append(ConnectionError("database restarting"))
    loop = asyncio.create_task(watch_nodes(deps))
    try:
        await eventually(lambda: _value(uow.events_of(SaveCheckpoint)), what="the save command", timeout=5)
        assert watch.retried == [{"n0"}] and deps.deadline_wake.is_set()
    finally:
        deps.stop.set()
        await asyncio.wait_for(loop, 5)
    assert watch.started and watch.stopped


async def _value(value: Any) -> Any:
    return value
