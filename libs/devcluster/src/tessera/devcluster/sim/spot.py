"""Spot interruptions: the notice a cloud gives before it reclaims an instance, then the node's end.

What a cluster with the AWS Node Termination Handler (NTH) shows on a spot interruption notice:

- the taint `aws-node-termination-handler/spot-itn=<event id>:NoSchedule` (NTH's key, its event id as
  the value, cut to 63 characters) and a cordon (`spec.unschedulable`), as NTH in cordon-only mode;
  draining is left to Tessera, whose checkpoint service asks the jobs to save before the scheduler
  evicts them;
- `tessera.io/termination-deadline` on the node (RFC 3339; the deadline the checkpoint service reads
  from a node), and a `SpotInterruption` condition saying when the instance goes (wall-clock time: the
  notice is in simulated seconds, like every devcluster delay);
- when the notice runs out, the Node object is deleted, as the cloud controller manager deletes the
  Node of a terminated instance. The GPU Operator sees the deletion as a lost node, and the pods still
  on it fail with reason `NodeLost` (the devcluster's node-loss semantics).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import secrets
from dataclasses import dataclass
from typing import Any

from tessera.devcluster.apiserver.clock import rfc3339, rfc3339_now
from tessera.devcluster.apiserver.errors import ApiError
from tessera.devcluster.apiserver.resources import NODES
from tessera.devcluster.sim.context import SimContext

log = logging.getLogger(__name__)

SPOT_INTERRUPTION_TAINT = "aws-node-termination-handler/spot-itn"
TERMINATION_DEADLINE_ANNOTATION = "tessera.io/termination-deadline"
SPOT_INTERRUPTION_CONDITION = "SpotInterruption"
#: what AWS gives: a two-minute warning
DEFAULT_NOTICE_S = 120.0
_MAX_TAINT_VALUE = 63


class SpotInterruptionError(Exception):
    """The node cannot take a spot interruption now (it already has one, or it is gone)."""


@dataclass(frozen=True)
class SpotNotice:
    node: str
    event_id: str
    notice_s: float  # simulated seconds until the node is deleted
    terminates_at: str  # RFC 3339, wall clock

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "spot-interruption",
            "event_id": self.event_id,
            "notice_s": self.notice_s,
            "terminates_at": self.terminates_at,
        }


@dataclass
class _Pending:
    notice: SpotNotice
    task: asyncio.Task[None]
    was_unschedulable: bool


class SpotInterruptions:
    """Runs on the devcluster's event loop: `interrupt` and `cancel` are called there."""

    def __init__(self, ctx: SimContext) -> None:
        self.ctx = ctx
        self._pending: dict[str, _Pending] = {}

    def pending(self, node: str) -> SpotNotice | None:
        found = self._pending.get(node)
        return found.notice if found else None

    def interrupt(self, name: str, notice_s: float) -> SpotNotice:
        if notice_s < 0:
            raise ValueError(f"notice_s: must not be negative, got {notice_s}")
        if name in self._pending:
            already = self._pending[name].notice
            raise SpotInterruptionError(
                f"node {name} already has a spot interruption notice ({already.event_id}); "
                f"it is deleted at {already.terminates_at}"
            )
        node = self.ctx.store.find(NODES, None, name)
        if node is None or self.ctx.nodes[name].lost:
            raise SpotInterruptionError(f"node {name} is gone or lost; there is no instance to interrupt")
        now = datetime.datetime.now(datetime.UTC)
        notice = SpotNotice(
            node=name,
            event_id=f"spot-itn-{secrets.token_hex(8)}"[:_MAX_TAINT_VALUE],
            notice_s=notice_s,
            terminates_at=rfc3339(now + datetime.timedelta(seconds=notice_s / self.ctx.settings.speed)),
        )
        was_unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
        self.ctx.store.mutate(NODES, None, name, lambda obj: _mark(obj, notice, rfc3339_now()))
        task = asyncio.get_running_loop().create_task(self._terminate(notice))
        self._pending[name] = _Pending(notice, task, was_unschedulable)
        log.info(
            "node %s: spot interruption notice %s; deleted at %s",
            name,
            notice.event_id,
            notice.terminates_at,
        )
        return notice

    async def _terminate(self, notice: SpotNotice) -> None:
        await self.ctx.clock.sleep(notice.notice_s)
        self._pending.pop(notice.node, None)
        log.info("node %s: spot instance reclaimed (%s); deleting the node", notice.node, notice.event_id)
        with contextlib.suppress(ApiError):  # someone deleted it first
            self.ctx.store.delete(NODES, None, notice.node)

    def cancel(self, name: str) -> bool:
        """Withdraw a pending notice (a devcluster convenience; clouds do not): taint, cordon and marks go."""
        pending = self._pending.pop(name, None)
        if pending is None:
            return False
        pending.task.cancel()
        with contextlib.suppress(ApiError):
            self.ctx.store.mutate(NODES, None, name, lambda obj: _unmark(obj, pending.was_unschedulable))
        return True

    async def stop(self) -> None:
        pending, self._pending = list(self._pending.values()), {}
        for entry in pending:
            entry.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await entry.task


def _mark(node: dict[str, Any], notice: SpotNotice, now: str) -> None:
    spec = node.setdefault("spec", {})
    taints = [t for t in spec.get("taints") or [] if t.get("key") != SPOT_INTERRUPTION_TAINT]
    taints.append(
        {"key": SPOT_INTERRUPTION_TAINT, "value": notice.event_id, "effect": "NoSchedule", "timeAdded": now}
    )
    spec["taints"] = taints
    spec["unschedulable"] = True
    node["metadata"].setdefault("annotations", {})[TERMINATION_DEADLINE_ANNOTATION] = notice.terminates_at
    status = node.setdefault("status", {})
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != SPOT_INTERRUPTION_CONDITION]
    conditions.append(
        {
            "type": SPOT_INTERRUPTION_CONDITION,
            "status": "True",
            "reason": "SpotInterruptionNotice",
            "message": f"the spot instance is reclaimed at {notice.terminates_at} ({notice.event_id})",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
    )
    status["conditions"] = conditions


def _unmark(node: dict[str, Any], was_unschedulable: bool) -> None:
    spec = node.setdefault("spec", {})
    taints = [t for t in spec.get("taints") or [] if t.get("key") != SPOT_INTERRUPTION_TAINT]
    if taints:
        spec["taints"] = taints
    else:
        spec.pop("taints", None)
    if not was_unschedulable:
        spec.pop("unschedulable", None)
    (node["metadata"].get("annotations") or {}).pop(TERMINATION_DEADLINE_ANNOTATION, None)
    status = node.setdefault("status", {})
    status["conditions"] = [
        c for c in status.get("conditions") or [] if c.get("type") != SPOT_INTERRUPTION_CONDITION
    ]
