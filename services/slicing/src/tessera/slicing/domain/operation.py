"""One node's reconfiguration as a state machine, pure. Every step is stored, so a restart resumes it.

    planned -> [cordoned -> [draining]] -> applying -> verifying -> succeeded
                                               ^  |          |
                                               +--+----------+   a failed attempt, retried after a backoff
    any state before the first write           -> rolled_back    (nothing changed; the node as it was)
    applying / verifying, retries spent        -> failed         (the node is left cordoned, with the reason)
    applying / verifying, the node deleted     -> failed         (outcome node_gone: nothing left to cordon)

A MIG change always cordons the node: the GPU Operator's MIG manager pauses the node's GPU operands
while it works, so nothing new should land there. A time-slicing or MPS change cordons only when the
plan asks to drain. The domain decides; the service layer does the I/O the decision names (cordon,
write the config and label, read the node) and stores the result before it acts on the next step.
Each attempt writes its own config name (`<config>-<attempt>`), so a retry is a label change the MIG
manager or device plugin sees, never a repeat it could ignore. While the MIG manager reports that it
is rebooting the node for the attempt, the apply deadline moves on (`rebooting`), up to the policy's
reboot allowance an attempt: a slow reboot is not a MIG manager that is stuck.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from tessera.contracts.base import Message
from tessera.contracts.slicing import GpuLayoutSpec, LayoutPlanned, ReconfigFailed, Reconfigured


class OpState(StrEnum):
    PLANNED = "planned"
    CORDONED = "cordoned"
    DRAINING = "draining"
    APPLYING = "applying"
    VERIFYING = "verifying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"


OPEN_STATES = frozenset(
    {OpState.PLANNED, OpState.CORDONED, OpState.DRAINING, OpState.APPLYING, OpState.VERIFYING}
)

TRANSITIONS: Mapping[OpState, frozenset[OpState]] = {
    OpState.PLANNED: frozenset({OpState.CORDONED, OpState.APPLYING, OpState.ROLLED_BACK}),
    OpState.CORDONED: frozenset({OpState.DRAINING, OpState.APPLYING, OpState.ROLLED_BACK}),
    OpState.DRAINING: frozenset({OpState.APPLYING, OpState.ROLLED_BACK}),
    OpState.APPLYING: frozenset({OpState.APPLYING, OpState.VERIFYING, OpState.FAILED, OpState.ROLLED_BACK}),
    OpState.VERIFYING: frozenset({OpState.APPLYING, OpState.SUCCEEDED, OpState.FAILED}),
}


class ChangeKind(StrEnum):
    MIG = "mig"
    TIME_SLICING = "time_slicing"
    MPS = "mps"


class Action(StrEnum):
    """What the service layer must do next for an open operation."""

    CORDON = "cordon"  # cordon the node (remembering whether someone else had), then `cordoned`
    WAIT_DRAINED = "wait_drained"  # until no pod holds an affected GPU, or the drain deadline
    WRITE = "write"  # write this attempt's config and label, then `written`
    WAIT_RETRY = "wait_retry"  # a failed attempt's backoff runs until `retry_at`
    RETRY = "retry"  # the backoff is over: `retry`
    WAIT_APPLIED = "wait_applied"  # follow the node's state label (MIG) to success or failed
    VERIFY = "verify"  # until the node advertises the expected resources, or the deadline
    NONE = "none"  # the operation has ended


class InvalidTransition(Exception):
    def __init__(self, operation_id: str, state: OpState, to: OpState) -> None:
        super().__init__(f"slicing operation {operation_id} cannot go from {state} to {to}")
        self.state = state
        self.to = to


@dataclass(frozen=True)
class GpuTarget:
    """One GPU as the change leaves it."""

    index: int
    uuid: str
    kind: str  # exclusive, mig, time_slicing or mps
    mig_profiles: tuple[str, ...] = ()
    replicas: int = 1

    def spec(self) -> GpuLayoutSpec:
        return GpuLayoutSpec.model_validate(
            {
                "index": self.index,
                "kind": self.kind,
                "mig_profiles": list(self.mig_profiles),
                "replicas": self.replicas,
            }
        )


@dataclass(frozen=True)
class NodeChange:
    """What one operation writes to one node: a named config, and what the node advertises after it."""

    node: str
    kind: ChangeKind
    config: str  # the base name; attempt n writes `<config>-<n>`
    body: str  # the mig-parted entry list, or the device-plugin config, as YAML
    gpus: tuple[GpuTarget, ...]
    expected_resources: Mapping[str, int]  # the node's GPU resources once applied
    previous_config: str | None = None  # the label value before the change
    drain: bool = False
    reason: str = ""

    def __post_init__(self) -> None:
        if not self.node:
            raise ValueError("change.node: must not be empty")
        if not self.config or len(self.config) > 50:
            raise ValueError(f"change.config: must be 1 to 50 characters, got {self.config!r}")
        if not self.gpus:
            raise ValueError(f"change.gpus: a change to node {self.node} must touch at least one GPU")

    @property
    def cordons(self) -> bool:
        return self.kind is ChangeKind.MIG or self.drain

    @property
    def affected_uuids(self) -> frozenset[str]:
        return frozenset(g.uuid for g in self.gpus)


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    backoff: timedelta = timedelta(seconds=5)
    max_backoff: timedelta = timedelta(minutes=5)
    drain_timeout: timedelta = timedelta(minutes=30)
    apply_timeout: timedelta = timedelta(minutes=5)
    verify_timeout: timedelta = timedelta(minutes=2)
    #: time the MIG manager reports `rebooting` (the node reboots to apply the layout) is not counted
    #: against `apply_timeout`, up to this much an attempt
    reboot_allowance: timedelta = timedelta(minutes=15)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"retry.max_attempts: must be >= 1, got {self.max_attempts}")
        if self.reboot_allowance < timedelta(0):
            raise ValueError(f"retry.reboot_allowance: must be >= 0, got {self.reboot_allowance}")

    def backoff_after(self, attempts: int) -> timedelta:
        """Doubling from `backoff` after each failed attempt, at most `max_backoff`."""
        return min(self.max_backoff, self.backoff * (1 << max(0, attempts - 1)))


@dataclass
class Operation:
    operation_id: str
    change: NodeChange
    state: OpState
    created_at: datetime
    updated_at: datetime
    attempts: int = 0
    written: bool = False
    retry_at: datetime | None = None
    deadline: datetime | None = None
    cordoned_by_us: bool = False
    reason: str | None = None
    #: the last time this attempt found the MIG manager `rebooting` the node (None: not since then)
    rebooting_since: datetime | None = None
    #: how much rebooting time this attempt's deadline was moved on by (at most the reboot allowance)
    reboot_credit: timedelta = timedelta(0)
    events: list[Message] = field(default_factory=list)

    @classmethod
    def plan(cls, operation_id: str, change: NodeChange, now: datetime) -> Operation:
        op = cls(operation_id, change, OpState.PLANNED, now, now)
        op.events.append(
            LayoutPlanned(
                operation_id=operation_id,
                node=change.node,
                kind=change.kind.value,
                config=change.config,
                gpus=[g.spec() for g in change.gpus],
                drain=change.drain,
                reason=change.reason,
            )
        )
        return op

    @property
    def open(self) -> bool:
        return self.state in OPEN_STATES

    @property
    def attempt_config(self) -> str:
        """The config name the current attempt writes and labels the node with."""
        return f"{self.change.config}-{max(1, self.attempts)}"

    def next_action(self, now: datetime) -> Action:
        match self.state:
            case OpState.PLANNED:
                return Action.CORDON if self.change.cordons else Action.WRITE
            case OpState.CORDONED | OpState.DRAINING:
                return Action.WAIT_DRAINED
            case OpState.APPLYING if self.retry_at is not None:
                return Action.RETRY if now >= self.retry_at else Action.WAIT_RETRY
            case OpState.APPLYING:
                return Action.WAIT_APPLIED if self.written else Action.WRITE
            case OpState.VERIFYING:
                return Action.VERIFY
        return Action.NONE

    # ---- transitions ------------------------------------------------------------------------

    def cordoned(self, now: datetime, *, by_us: bool) -> None:
        """The node is unschedulable; `by_us` False when it already was (it is then left so)."""
        self._go(OpState.CORDONED, now)
        self.cordoned_by_us = by_us

    def drained(self, now: datetime, policy: RetryPolicy) -> None:
        """No pod holds an affected GPU any more (or none did): the first attempt starts."""
        self._begin_applying(now, policy)

    def start_draining(self, now: datetime, policy: RetryPolicy) -> None:
        """Pods still hold affected GPUs: wait for them, at most the drain timeout."""
        if self.state is OpState.DRAINING:
            return
        self._go(OpState.DRAINING, now)
        self.deadline = now + policy.drain_timeout

    def start_applying(self, now: datetime, policy: RetryPolicy) -> None:
        """An uncordoned change starts its first attempt straight away."""
        self._begin_applying(now, policy)

    def written_config(self, now: datetime) -> None:
        if self.state is not OpState.APPLYING or self.retry_at is not None:
            raise InvalidTransition(self.operation_id, self.state, OpState.APPLYING)
        self.written = True
        self.updated_at = now

    def applied(self, now: datetime, policy: RetryPolicy) -> None:
        """The MIG manager reported success (or the device plugin has its config): verify it."""
        self._go(OpState.VERIFYING, now)
        self.deadline = now + policy.verify_timeout
        self._forget_reboot()

    def rebooting(self, now: datetime, policy: RetryPolicy) -> None:
        """The MIG manager reports it is rebooting the node for this attempt. The time since this
        attempt last found it rebooting does not count against the apply timeout: the deadline moves
        on by it, up to `policy.reboot_allowance` an attempt. (Time before the first such report, or
        between the last one and the next state, counts as ordinary pending time.)"""
        if self.state is not OpState.APPLYING or not self.written:
            raise InvalidTransition(self.operation_id, self.state, OpState.APPLYING)
        if self.rebooting_since is not None and self.deadline is not None:
            credit = min(now - self.rebooting_since, policy.reboot_allowance - self.reboot_credit)
            if credit > timedelta(0):
                self.deadline += credit
                self.reboot_credit += credit
        self.rebooting_since = now

    def not_rebooting(self) -> None:
        """The MIG manager no longer reports rebooting (pending again, or an outcome)."""
        self.rebooting_since = None

    def retry(self, now: datetime, policy: RetryPolicy) -> None:
        if self.state is not OpState.APPLYING or self.retry_at is None or now < self.retry_at:
            raise InvalidTransition(self.operation_id, self.state, OpState.APPLYING)
        self.retry_at = None
        self.attempts += 1
        self.written = False
        self.deadline = now + policy.apply_timeout
        self._forget_reboot()
        self.updated_at = now

    def fails_for_good(self, policy: RetryPolicy) -> bool:
        """Whether a failed attempt now ends the operation: its retries are spent."""
        return self.attempts >= policy.max_attempts

    def failure_reason(self, why: str) -> str:
        """Why the operation fails for good when its last attempt failed for `why`."""
        return f"{self.attempts} attempts failed; last: {why}"

    def attempt_failed(self, why: str, now: datetime, policy: RetryPolicy) -> None:
        """An apply failed or timed out: retry after a backoff, or, retries spent, fail for good
        (outcome left_cordoned: the service has cordoned the node and reported the failure on it)."""
        if not self.fails_for_good(policy):
            self._go(OpState.APPLYING, now)
            self.retry_at = now + policy.backoff_after(self.attempts)
            self.written = False
            self.deadline = None
            self._forget_reboot()
            self.reason = f"attempt {self.attempts} failed: {why}"
            return
        self._go(OpState.FAILED, now)
        self.deadline = None
        self._forget_reboot()
        self.reason = self.failure_reason(why)
        self._failed("left_cordoned", self.reason)

    def succeeded(self, now: datetime, resources: Mapping[str, int]) -> None:
        self._go(OpState.SUCCEEDED, now)
        self.deadline = None
        self.reason = None
        self.events.append(
            Reconfigured(
                operation_id=self.operation_id,
                node=self.change.node,
                kind=self.change.kind.value,
                config=self.attempt_config,
                gpus=[g.spec() for g in self.change.gpus],
                attempts=self.attempts,
                duration_s=max(0.0, (now - self.created_at).total_seconds()),
                resources=dict(resources),
                reason=self.change.reason,
            )
        )

    def roll_back(self, why: str, now: datetime) -> None:
        """Give up before the node was changed; the service has uncordoned it if it cordoned it."""
        if self.written or self.attempts > 1 or self.retry_at is not None:
            raise InvalidTransition(self.operation_id, self.state, OpState.ROLLED_BACK)
        self._go(OpState.ROLLED_BACK, now)
        self.deadline = None
        self.reason = why
        self._failed("rolled_back", why)

    def node_gone(self, now: datetime) -> None:
        """The node was deleted: the operation ends, rolled back when nothing was written yet, else
        failed (there is no node left to retry on, or to cordon)."""
        if not self.open:
            return
        why = f"node {self.change.node} is gone"
        if not (self.written or self.attempts > 1 or self.retry_at is not None):
            self.roll_back(why, now)
            return
        self._go(OpState.FAILED, now)
        self.deadline = None
        self.retry_at = None
        self.reason = why
        self._failed("node_gone", why)

    def overdue(self, now: datetime) -> bool:
        return self.deadline is not None and now >= self.deadline

    # ---- internals --------------------------------------------------------------------------

    def _begin_applying(self, now: datetime, policy: RetryPolicy) -> None:
        self._go(OpState.APPLYING, now)
        self.attempts = 1
        self.written = False
        self.retry_at = None
        self.deadline = now + policy.apply_timeout
        self._forget_reboot()

    def _forget_reboot(self) -> None:
        self.rebooting_since = None
        self.reboot_credit = timedelta(0)

    def _go(self, to: OpState, now: datetime) -> None:
        if to not in TRANSITIONS.get(self.state, frozenset()):
            raise InvalidTransition(self.operation_id, self.state, to)
        self.state = to
        self.updated_at = now

    def _failed(self, outcome: str, why: str) -> None:
        self.events.append(
            ReconfigFailed.model_validate(
                {
                    "operation_id": self.operation_id,
                    "node": self.change.node,
                    "kind": self.change.kind.value,
                    "config": self.attempt_config,
                    "outcome": outcome,
                    "attempts": self.attempts,
                    "reason": why,
                }
            )
        )


class ApplyOutcome(StrEnum):
    PENDING = "pending"
    SUCCESS = "success"
    FAILED = "failed"


def mig_outcome(config_label: str | None, state_label: str | None, attempt_config: str) -> ApplyOutcome:
    """Where the MIG manager is with an attempt, from the node's `nvidia.com/mig.config` and `.state`.

    Until the label carries this attempt's name, and the state is `success` or `failed`, the attempt
    is pending: the state of an earlier label says nothing about this one. The write that names the
    attempt sets the state to `pending` in the same patch (`ClusterOps.write_mig_config`), so an
    earlier attempt's `failed` or `success` is never read beside this attempt's name."""
    if config_label != attempt_config:
        return ApplyOutcome.PENDING
    if state_label == "success":
        return ApplyOutcome.SUCCESS
    if state_label == "failed":
        return ApplyOutcome.FAILED
    return ApplyOutcome.PENDING


def advertises(resources: Mapping[str, int], expected: Mapping[str, int]) -> bool:
    """The node advertises exactly the expected count of each expected GPU resource."""
    return all(resources.get(name, 0) == count for name, count in expected.items())
