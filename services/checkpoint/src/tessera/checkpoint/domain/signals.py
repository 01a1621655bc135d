"""Which node changes announce that a node is going away, and by when. Pure.

Spot reclaimers, autoscalers and maintenance handlers all mark a node before they take it: a taint
(the AWS Node Termination Handler, Karpenter, GKE), sometimes a label, and sometimes an annotation with
the time the node goes. A `TerminationPolicy` reads those marks into `NodeSignal`s; each signal is
acted on once, however often the node is seen again (a restart relists every node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta


@dataclass(frozen=True)
class NodeState:
    """What a node's metadata says, as far as its termination goes."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    taints: Mapping[str, str] = field(default_factory=dict)  # key -> value


@dataclass(frozen=True)
class NodeSignal:
    """One mark on one node: `key` is `taint:<key>` or `label:<key>`; a new `value` is a new signal."""

    node: str
    key: str
    value: str
    reason: str
    noticed_at: datetime
    deadline: datetime


@dataclass(frozen=True)
class TerminationPolicy:
    taints: Mapping[str, str]  # taint key -> reason
    labels: Mapping[str, str]  # label key, or key=value -> reason
    deadline_annotations: Sequence[str]
    notice: timedelta

    def signals(self, node: NodeState, now: datetime) -> list[NodeSignal]:
        deadline = self.deadline(node, now)
        found = [
            NodeSignal(node.name, f"taint:{key}", value, self.taints[key], now, deadline)
            for key, value in sorted(node.taints.items())
            if key in self.taints
        ]
        for matcher, reason in sorted(self.labels.items()):
            key, has_value, wanted = matcher.partition("=")
            value = node.labels.get(key)
            if value is not None and (not has_value or value == wanted):
                found.append(NodeSignal(node.name, f"label:{key}", value, reason, now, deadline))
        return found

    def deadline(self, node: NodeState, now: datetime) -> datetime:
        """The first deadline annotation that parses, else `now` plus the notice."""
        for key in self.deadline_annotations:
            at = parse_time(node.annotations.get(key, ""))
            if at is not None:
                return at
        return now + self.notice


def parse_time(value: str) -> datetime | None:
    """RFC 3339 (`2026-11-24T10:00:00Z`) or Unix seconds; None when it is neither."""
    value = value.strip()
    if not value:
        return None
    try:
        return datetime.fromtimestamp(float(value), UTC)
    except (ValueError, OverflowError, OSError):
        pass
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
