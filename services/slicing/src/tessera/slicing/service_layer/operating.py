"""Drive open operations one step at a time: take the node's lease, do the I/O the step names, store
the result. Each step is its own transaction, so a restart (or another replica, once the lease runs
out) resumes where the last stored step left off.

Writes to the cluster are idempotent (the same config name, the same label, cordon again), so a step
interrupted after its I/O but before its commit is simply done again."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from tessera.cluster.conventions.names import CHECKPOINTABLE_ANNOTATION, JOB_ID_LABEL
from tessera.cluster.domain.node import MigConfigState, Node
from tessera.cluster.domain.requirements import Pod
from tessera.cluster.port import NotFound
from tessera.slicing.domain.operation import (
    Action,
    ApplyOutcome,
    ChangeKind,
    Operation,
    OpState,
    RetryPolicy,
    advertises,
    mig_outcome,
)
from tessera.slicing.service_layer.cluster_view import GpuUse, gpu_use
from tessera.slicing.service_layer.ports import CORDONED_BY_ANNOTATION, DRAIN_LABEL, ClusterOps
from tessera.slicing.service_layer.unit_of_work import SlicingUnitOfWork

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Operator:
    """Who drives operations, and how: this replica's lease holder name, its lease time, the retry policy."""

    cluster: ClusterOps
    uow: Callable[[], SlicingUnitOfWork]
    holder: str
    policy: RetryPolicy
    lease_ttl: timedelta
    clock: Callable[[], datetime]
    #: how long a checkpointable job on a GPU being drained gets to checkpoint before it is moved
    #: (the checkpoint service asks it; None: such jobs are waited for like any other pod)
    checkpoint_notice: timedelta | None = None


async def open_operations(operator: Operator) -> list[str]:
    async with operator.uow() as uow:
        return [op.operation_id for op in await uow.operations.open_ones()]


async def step(operator: Operator, operation_id: str) -> bool:
    """Take the operation one step further; False when there was nothing to do now (waiting, another
    replica holds the node, or the operation has ended)."""
    async with operator.uow() as uow:
        op = await uow.operations.get(operation_id)
        if op is None or not op.open:
            return False
        node_name = op.change.node
        if not await uow.leases.acquire(node_name, operator.holder, operator.lease_ttl):
            return False
        before = (op.state, op.attempts, op.written, op.retry_at)
        now = operator.clock()
        try:
            await _act(operator, op, now, uow)
        except NotFound:
            if not await _node_is_gone(operator.cluster, node_name):
                raise
            op.node_gone(now)
            log.warning(
                "slicing operation ended: its node is gone",
                extra={"operation": op.operation_id, "node": node_name, "state": op.state.value},
            )
        await uow.operations.save(op)
        if not op.open:
            await _forget_earlier_attempts(operator, op)
            await _end_move(operator, op)
            await uow.leases.release(node_name, operator.holder)
        await uow.commit()
        return before != (op.state, op.attempts, op.written, op.retry_at)


async def _act(operator: Operator, op: Operation, now: datetime, uow: SlicingUnitOfWork) -> None:
    cluster, policy, change = operator.cluster, operator.policy, op.change
    match op.next_action(now):
        case Action.CORDON:
            node = await cluster.node(change.node)
            # ours if it was not cordoned, or if this step cordoned it before and was lost before
            # its commit (the annotation, written in the cordon's patch, names this operation)
            by_us = not node.unschedulable or node.annotations.get(CORDONED_BY_ANNOTATION) == op.operation_id
            if by_us:
                await cluster.cordon(change.node, True, op.operation_id)
            op.cordoned(now, by_us=by_us)
        case Action.WAIT_DRAINED:
            node = await cluster.node(change.node)
            pods = await _holding_pods(operator, op, node)
            holders = sorted({f"{pod.namespace}/{pod.name}" for pod in pods})
            if not holders:
                op.drained(now, policy)
            elif change.drain and not op.overdue(now):
                op.start_draining(now, policy)
                await _move_checkpointable(operator, op, node, pods, uow)
            else:
                why = "drain timed out" if change.drain else "the GPUs are no longer idle"
                await _roll_back(operator, op, f"{why}: {', '.join(holders)} hold them", now)
        case Action.WRITE:
            if op.state is OpState.PLANNED:
                if not change.cordons:  # a change that cordons checked its GPUs' pods while draining
                    node = await cluster.node(change.node)
                    taken = _shares_taken(op, gpu_use(node, await cluster.pods_on(change.node)))
                    if taken is not None:
                        await _roll_back(operator, op, f"the GPUs changed since the plan: {taken}", now)
                        return
                op.start_applying(now, policy)
            if change.kind is ChangeKind.MIG:
                await cluster.write_mig_config(change.node, op.attempt_config, change.body)
            else:
                await cluster.write_sharing_config(change.node, op.attempt_config, change.body)
            op.written_config(now)
        case Action.WAIT_APPLIED:
            node = await cluster.node(change.node)
            outcome = _outcome(op, node)
            if outcome is ApplyOutcome.SUCCESS:
                op.applied(now, policy)
            elif outcome is ApplyOutcome.FAILED:
                await _attempt_failed(
                    operator, op, f"nvidia.com/mig.config.state is failed for {op.attempt_config}", now
                )
            else:
                if _rebooting(op, node):  # a reboot's time is not the MIG manager being slow
                    op.rebooting(now, policy)
                else:
                    op.not_rebooting()
                if op.overdue(now):
                    await _attempt_failed(
                        operator, op, f"{op.attempt_config} still pending after the apply timeout", now
                    )
        case Action.VERIFY:
            node = await cluster.node(change.node)
            resources = {k: v for k, v in node.extended_allocatable.items() if k.startswith("nvidia.com/")}
            if advertises(resources, change.expected_resources):
                if op.cordoned_by_us:
                    await cluster.cordon(change.node, False, op.operation_id)
                await cluster.clear_failure(change.node)
                op.succeeded(now, resources)
            elif op.overdue(now):
                expected = ", ".join(f"{k}={v}" for k, v in sorted(change.expected_resources.items()))
                got = ", ".join(f"{k}={v}" for k, v in sorted(resources.items()))
                await _attempt_failed(operator, op, f"the node advertises {got}, not {expected}", now)
        case Action.RETRY:
            op.retry(now, policy)
        case Action.WAIT_RETRY | Action.NONE:
            pass


async def _node_is_gone(cluster: ClusterOps, name: str) -> bool:
    """Whether the node itself was deleted (a NotFound from a step may name something else)."""
    try:
        await cluster.node(name)
    except NotFound:
        return True
    return False


async def _forget_earlier_attempts(operator: Operator, op: Operation) -> None:
    """Earlier attempts' configs: no label names them any more (the last one stays, on the node)."""
    stale = [f"{op.change.config}-{n}" for n in range(1, op.attempts)]
    await operator.cluster.forget_configs(op.change.kind is ChangeKind.MIG, stale)


def _outcome(op: Operation, node: Node) -> ApplyOutcome:
    if op.change.kind is not ChangeKind.MIG:
        return ApplyOutcome.SUCCESS  # the device plugin has no state label: verifying is the check
    return mig_outcome(
        node.mig_config, node.mig_config_state.value if node.mig_config_state else None, op.attempt_config
    )


def _rebooting(op: Operation, node: Node) -> bool:
    """The MIG manager reports it is rebooting the node for this attempt's layout."""
    return (
        op.change.kind is ChangeKind.MIG
        and node.mig_config == op.attempt_config
        and node.mig_config_state is MigConfigState.REBOOTING
    )


async def _holding_pods(operator: Operator, op: Operation, node: Node) -> list[Pod]:
    """The pods on the node that hold a GPU the change affects."""
    pods = await operator.cluster.pods_on(op.change.node)
    use = gpu_use(node, pods)
    names = {pod for uuid in op.change.affected_uuids if uuid in use for pod in use[uuid].pods}
    return [pod for pod in pods if f"{pod.namespace}/{pod.name}" in names]


async def _move_checkpointable(
    operator: Operator, op: Operation, node: Node, pods: list[Pod], uow: SlicingUnitOfWork
) -> None:
    """Checkpoint-and-move: a checkpointable job holding a GPU being drained is asked to checkpoint (the
    node is marked as going away by the drain's checkpoint deadline, which the checkpoint service acts
    on), and its pods on the node are evicted once the checkpoint service lets the job go; its
    controller makes them again, and the scheduler places them on another node."""
    notice = operator.checkpoint_notice
    movable = {
        job: [pod for pod in pods if pod.labels.get(JOB_ID_LABEL) == job]
        for pod in pods
        if pod.annotations.get(CHECKPOINTABLE_ANNOTATION) == "true" and (job := pod.labels.get(JOB_ID_LABEL))
    }
    if notice is None or not movable or op.deadline is None:
        return
    started = op.deadline - operator.policy.drain_timeout
    if DRAIN_LABEL not in node.labels:
        await operator.cluster.mark_draining(op.change.node, min(op.deadline, started + notice))
        log.info(
            "asked checkpointable jobs to checkpoint before a drain",
            extra={"operation": op.operation_id, "node": op.change.node, "jobs": sorted(movable)},
        )
    for job in sorted(await uow.signals.ready_for_eviction(movable, started)):
        for pod in movable[job]:
            await operator.cluster.evict(pod)
            log.info(
                "moved a checkpointed pod off a GPU being drained",
                extra={"operation": op.operation_id, "node": op.change.node, "job_id": job, "pod": pod.name},
            )


async def _end_move(operator: Operator, op: Operation) -> None:
    """The operation ended: the node no longer announces that it is going away."""
    if operator.checkpoint_notice is None:
        return
    try:
        node = await operator.cluster.node(op.change.node)
    except NotFound:
        return  # the node is gone, and its label with it
    if DRAIN_LABEL in node.labels:
        await operator.cluster.mark_draining(op.change.node, None)


def _shares_taken(op: Operation, use: Mapping[str, GpuUse]) -> str | None:
    """Why a sharing change planned on an earlier view would now take a share a running pod holds (a
    pod placed since the plan): more pods on a GPU than its new replicas, or a GPU a pod holds whole
    (or with devices not known) to be shared; None when every holder keeps what it has."""
    for target in op.change.gpus:
        holders = sorted(use[target.uuid].pods) if target.uuid in use else []
        if len(holders) > target.replicas:
            return f"{', '.join(holders)} hold GPU {target.index}, more than its {target.replicas} replica(s)"
        whole = [pod for pod in holders if use[target.uuid].milli_of.get(pod, 1000) >= 1000]
        if whole and target.replicas > 1:
            return f"{', '.join(whole)} hold GPU {target.index} whole"
    return None


async def _roll_back(operator: Operator, op: Operation, why: str, now: datetime) -> None:
    if op.cordoned_by_us:
        await operator.cluster.cordon(op.change.node, False, op.operation_id)
    op.roll_back(why, now)
    log.warning(
        "slicing operation rolled back",
        extra={"operation": op.operation_id, "node": op.change.node, "reason": why},
    )


async def _attempt_failed(operator: Operator, op: Operation, why: str, now: datetime) -> None:
    if op.fails_for_good(operator.policy):
        # The node is cordoned and told before the operation says it was left cordoned: a node
        # deleted meanwhile raises NotFound here, and `step` ends the operation node_gone instead.
        await _leave_cordoned(operator, op)
        await operator.cluster.report_failure(op.change.node, op.operation_id, op.failure_reason(why))
    op.attempt_failed(why, now, operator.policy)
    if op.state is OpState.FAILED:
        log.error(
            "slicing operation failed",
            extra={"operation": op.operation_id, "node": op.change.node, "reason": op.reason},
        )
    else:
        log.warning(
            "slicing attempt failed",
            extra={"operation": op.operation_id, "node": op.change.node, "reason": why},
        )


async def _leave_cordoned(operator: Operator, op: Operation) -> None:
    """A failed operation leaves its node cordoned, the cordon naming the operation like any other
    slicing writes (so it can be told from someone else's, and undone as slicing's). A cordon someone
    else holds (the node unschedulable, not by this operation) is left as it is, unnamed."""
    node = await operator.cluster.node(op.change.node)
    theirs = node.unschedulable and node.annotations.get(CORDONED_BY_ANNOTATION) != op.operation_id
    if theirs and not op.cordoned_by_us:
        return
    await operator.cluster.cordon(op.change.node, True, op.operation_id)
    op.cordoned_by_us = True
