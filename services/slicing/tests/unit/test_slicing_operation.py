"""The per-node operation state machine: the path each kind of change takes, retries with backoff,
failure that leaves the node cordoned, rollback before anything was written, the end of an operation
whose node is gone, what it announces, and the node's reboot kept off the apply timeout (within its
allowance)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from tessera.contracts.slicing import LayoutPlanned, ReconfigFailed, Reconfigured
from tessera.slicing.config import OperationSettings
from tessera.slicing.domain.operation import (
    Action,
    ApplyOutcome,
    ChangeKind,
    GpuTarget,
    InvalidTransition,
    NodeChange,
    Operation,
    OpState,
    RetryPolicy,
    advertises,
    mig_outcome,
)

T0 = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)
POLICY = RetryPolicy(max_attempts=3, backoff=timedelta(seconds=2), max_backoff=timedelta(seconds=5))
MIG_GPU = GpuTarget(index=1, uuid="GPU-1", kind="mig", mig_profiles=("3g.40gb", "3g.40gb"))


def a_change(kind: ChangeKind = ChangeKind.MIG, drain: bool = False) -> NodeChange:
    gpu = MIG_GPU if kind is ChangeKind.MIG else GpuTarget(0, "GPU-0", kind.value, replicas=4)
    resources = {"nvidia.com/mig-3g.40gb": 2} if kind is ChangeKind.MIG else {"nvidia.com/gpu": 4}
    return NodeChange("a100-0", kind, "tessera-abc", "[]", (gpu,), resources, drain=drain, reason="demand")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def taken(op: Operation) -> list[object]:
    events, op.events = op.events, []
    return list(events)


def test_a_mig_change_is_planned_cordoned_applied_verified_and_announced() -> None:
    op = Operation.plan("op-1", a_change(), T0)
    [planned] = taken(op)
    assert isinstance(planned, LayoutPlanned) and planned.kind == "mig" and planned.gpus[0].index == 1
    assert op.next_action(T0) is Action.CORDON
    op.cordoned(at(1), by_us=True)
    assert op.next_action(at(1)) is Action.WAIT_DRAINED
    op.drained(at(1), POLICY)
    assert (op.state, op.attempts, op.next_action(at(1))) == (OpState.APPLYING, 1, Action.WRITE)
    assert op.attempt_config == "tessera-abc-1"
    op.written_config(at(2))
    assert op.next_action(at(2)) is Action.WAIT_APPLIED
    op.applied(at(5), POLICY)
    assert op.next_action(at(5)) is Action.VERIFY
    op.succeeded(at(6), {"nvidia.com/mig-3g.40gb": 2})
    [done] = taken(op)
    assert isinstance(done, Reconfigured)
    assert (done.attempts, done.duration_s, done.config) == (1, 6.0, "tessera-abc-1")
    assert not op.open and op.next_action(at(7)) is Action.NONE


def test_a_time_slicing_change_without_drain_does_not_cordon() -> None:
    op = Operation.plan("op-1", a_change(ChangeKind.TIME_SLICING), T0)
    assert op.next_action(T0) is Action.WRITE
    op.start_applying(T0, POLICY)
    assert op.state is OpState.APPLYING and not op.cordoned_by_us
    assert a_change(ChangeKind.TIME_SLICING, drain=True).cordons


def test_a_drain_waits_at_most_the_drain_timeout() -> None:
    op = Operation.plan("op-1", a_change(drain=True), T0)
    op.cordoned(T0, by_us=True)
    op.start_draining(T0, POLICY)
    op.start_draining(at(60), POLICY)  # still draining: the deadline does not move
    assert op.deadline == T0 + POLICY.drain_timeout
    assert not op.overdue(at(60)) and op.overdue(T0 + POLICY.drain_timeout)


def test_a_failed_attempt_is_retried_after_a_doubling_backoff_under_a_new_config_name() -> None:
    op = Operation.plan("op-1", a_change(), T0)
    op.cordoned(T0, by_us=True)
    op.drained(T0, POLICY)
    op.written_config(T0)
    op.attempt_failed("GPU 1 is busy", at(1), POLICY)
    assert (op.state, op.retry_at, op.written) == (OpState.APPLYING, at(3), False)
    assert op.next_action(at(2)) is Action.WAIT_RETRY
    with pytest.raises(InvalidTransition):
        op.retry(at(2), POLICY)
    assert op.next_action(at(3)) is Action.RETRY
    op.retry(at(3), POLICY)
    assert (op.attempts, op.attempt_config, op.next_action(at(3))) == (2, "tessera-abc-2", Action.WRITE)
    op.written_config(at(3))
    op.applied(at(4), POLICY)
    op.attempt_failed("the node does not advertise 2 nvidia.com/mig-3g.40gb", at(10), POLICY)
    assert op.retry_at == at(14)  # 2 s, then 4 s
    assert POLICY.backoff_after(5) == timedelta(seconds=5)  # capped
    assert taken(op)[1:] == []  # retries announce nothing


def test_spent_retries_fail_the_operation_left_cordoned_with_the_last_reason() -> None:
    op = Operation.plan("op-1", a_change(), T0)
    taken(op)
    op.cordoned(T0, by_us=True)
    op.drained(T0, POLICY)
    for attempt in range(1, 4):
        op.written_config(at(attempt * 10))
        op.attempt_failed(f"mig.config.state failed ({attempt})", at(attempt * 10 + 1), POLICY)
        if op.open:
            op.retry(op.retry_at or T0, POLICY)
    assert op.state is OpState.FAILED and op.attempts == 3
    [failed] = taken(op)
    assert isinstance(failed, ReconfigFailed)
    assert (
        failed.outcome == "left_cordoned"
        and "3 attempts failed; last: mig.config.state failed (3)" in failed.reason
    )


def test_rollback_only_before_anything_was_written() -> None:
    op = Operation.plan("op-1", a_change(), T0)
    taken(op)
    op.cordoned(T0, by_us=True)
    op.drained(T0, POLICY)
    op.roll_back("pod default/p now holds GPU-1", at(1))
    [failed] = taken(op)
    assert isinstance(failed, ReconfigFailed) and failed.outcome == "rolled_back"
    written = Operation.plan("op-2", a_change(), T0)
    written.start_applying(T0, POLICY)
    written.written_config(T0)
    with pytest.raises(InvalidTransition, match="op-2 cannot go from applying to rolled_back"):
        written.roll_back("too late", at(1))


def test_a_node_gone_ends_the_operation_rolled_back_before_a_write_and_failed_after() -> None:
    early = Operation.plan("op-1", a_change(), T0)
    taken(early)
    early.cordoned(T0, by_us=True)
    early.node_gone(at(1))
    assert (early.state, early.reason) == (OpState.ROLLED_BACK, "node a100-0 is gone")
    [rolled_back] = taken(early)
    assert isinstance(rolled_back, ReconfigFailed) and rolled_back.outcome == "rolled_back"

    late = Operation.plan("op-2", a_change(), T0)
    taken(late)
    late.start_applying(T0, POLICY)
    late.written_config(T0)
    late.applied(at(1), POLICY)
    late.node_gone(at(2))
    assert (late.state, late.reason, late.open) == (OpState.FAILED, "node a100-0 is gone", False)
    [failed] = taken(late)
    assert isinstance(failed, ReconfigFailed) and failed.reason == "node a100-0 is gone"
    assert failed.outcome == "node_gone"  # not left_cordoned: there is no node to be cordoned
    late.node_gone(at(3))  # an ended operation stays as it ended
    assert late.state is OpState.FAILED and taken(late) == []


def test_transitions_out_of_order_are_refused_naming_the_operation() -> None:
    op = Operation.plan("op-9", a_change(), T0)
    with pytest.raises(InvalidTransition, match="op-9 cannot go from planned to verifying"):
        op.applied(T0, POLICY)
    with pytest.raises(InvalidTransition):
        op.written_config(T0)


def test_bad_changes_and_policies_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"change\.gpus"):
        NodeChange("n", ChangeKind.MIG, "c", "[]", (), {})
    with pytest.raises(ValueError, match=r"change\.config"):
        NodeChange("n", ChangeKind.MIG, "x" * 51, "[]", (MIG_GPU,), {})
    with pytest.raises(ValueError, match=r"retry\.max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match=r"retry\.reboot_allowance"):
        RetryPolicy(reboot_allowance=timedelta(seconds=-1))


def test_rebooting_time_moves_the_apply_deadline_on_up_to_the_allowance() -> None:
    policy = RetryPolicy(apply_timeout=timedelta(seconds=60), reboot_allowance=timedelta(seconds=100))
    op = Operation.plan("op-1", a_change(), T0)
    op.cordoned(T0, by_us=True)
    op.drained(T0, policy)
    op.written_config(T0)
    assert op.deadline == at(60)
    op.rebooting(at(30), policy)  # the first report: nothing counted yet
    op.rebooting(at(70), policy)
    assert op.deadline == at(100) and not op.overdue(at(70))
    op.not_rebooting()  # pending again: that time counts
    op.rebooting(at(90), policy)
    op.rebooting(at(200), policy)  # 110 s more, of which 60 s are left of the allowance
    assert (op.deadline, op.reboot_credit) == (at(160), timedelta(seconds=100))
    assert op.overdue(at(200))
    op.attempt_failed("still pending", at(200), policy)
    assert (op.rebooting_since, op.reboot_credit) == (None, timedelta(0))  # the next attempt's own


def test_the_reboot_allowance_setting_reaches_the_policy_and_is_bounded() -> None:
    assert OperationSettings().policy().reboot_allowance == timedelta(minutes=15)
    assert OperationSettings(reboot_allowance_s=0).policy().reboot_allowance == timedelta(0)
    for bad in (-1, 86401):
        with pytest.raises(ValidationError, match="reboot_allowance_s"):
            OperationSettings(reboot_allowance_s=bad)


def test_rebooting_is_only_for_an_attempt_that_was_written() -> None:
    op = Operation.plan("op-1", a_change(), T0)
    with pytest.raises(InvalidTransition):
        op.rebooting(T0, POLICY)


def test_the_mig_state_counts_only_for_the_attempts_own_label() -> None:
    assert mig_outcome("tessera-abc-1", "success", "tessera-abc-2") is ApplyOutcome.PENDING
    assert mig_outcome("tessera-abc-2", "pending", "tessera-abc-2") is ApplyOutcome.PENDING
    assert mig_outcome("tessera-abc-2", "success", "tessera-abc-2") is ApplyOutcome.SUCCESS
    assert mig_outcome("tessera-abc-2", "failed", "tessera-abc-2") is ApplyOutcome.FAILED


def test_verification_compares_the_expected_resources_only() -> None:
    expected = {"nvidia.com/mig-3g.40gb": 2}
    assert advertises({"nvidia.com/mig-3g.40gb": 2, "nvidia.com/gpu": 7}, expected)
    assert not advertises({"nvidia.com/gpu": 8}, expected)
