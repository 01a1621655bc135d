"""Plugin outcomes: a :class:`Code` with a fixed meaning, reasons, and the per-node diagnosis of a failure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum


class Code(StrEnum):
    """What a plugin says; the meanings follow kube-scheduler's ``framework.Code``."""

    SUCCESS = "Success"
    ERROR = "Error"
    # The pod does not fit now; a change in the cluster (freed capacity, preemption) may fix it.
    UNSCHEDULABLE = "Unschedulable"
    # The pod can never fit this node as it is; only a change to the node itself may fix it.
    UNSCHEDULABLE_AND_UNRESOLVABLE = "UnschedulableAndUnresolvable"
    # Permit only: hold the pod until something allows or rejects it.
    WAIT = "Wait"
    # The plugin has nothing to say about this pod; later extension points of the plugin are skipped.
    SKIP = "Skip"


class Reason(StrEnum):
    """Why a node was rejected; the text reads in a diagnosis ("insufficient GPU on 12 nodes")."""

    NODE_UNSCHEDULABLE = "node unschedulable"
    NODE_SELECTOR_MISMATCH = "node didn't match the pod's node selector"
    NODE_AFFINITY_MISMATCH = "node didn't match the pod's node affinity"
    UNTOLERATED_TAINT = "untolerated taint"
    INSUFFICIENT_GPU = "insufficient GPU"
    UNHEALTHY_GPU = "unhealthy GPU"
    OVER_MPS_CLIENT_LIMIT = "GPU share over the node's MPS client limit"
    MODEL_NOT_ALLOWED = "model not allowed"
    INSUFFICIENT_MIG = "no free MIG device of the profile"
    INSUFFICIENT_CPU = "insufficient CPU"
    INSUFFICIENT_MEMORY = "insufficient memory"
    GANG_EXCEEDS_FREE_CAPACITY = "gang needs more GPUs than are free"
    GANG_INCOMPLETE = "gang members missing"
    GANG_REJECTED = "gang rejected"
    PERMIT_TIMEOUT = "gang timed out waiting for quorum"
    BIND_FAILED = "bind failed"


@dataclass(frozen=True, slots=True)
class Status:
    code: Code = Code.SUCCESS
    reasons: tuple[str, ...] = ()
    plugin: str = ""

    @property
    def ok(self) -> bool:
        return self.code is Code.SUCCESS

    @property
    def rejected(self) -> bool:
        return self.code in (Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE, Code.ERROR)

    def message(self) -> str:
        return "; ".join(self.reasons) or self.code.value

    def by(self, plugin: str) -> Status:
        """This status attributed to ``plugin`` (the framework stamps the name of the plugin that spoke)."""
        return self if self.plugin == plugin else Status(self.code, self.reasons, plugin)

    @classmethod
    def success(cls) -> Status:
        return _SUCCESS

    @classmethod
    def skip(cls) -> Status:
        return _SKIP

    @classmethod
    def unschedulable(cls, *reasons: str) -> Status:
        return cls(Code.UNSCHEDULABLE, reasons)

    @classmethod
    def unresolvable(cls, *reasons: str) -> Status:
        return cls(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, reasons)

    @classmethod
    def error(cls, *reasons: str) -> Status:
        return cls(Code.ERROR, reasons)

    @classmethod
    def wait(cls, *reasons: str) -> Status:
        return cls(Code.WAIT, reasons)


_SUCCESS = Status()
_SKIP = Status(Code.SKIP)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Why a pod fit nowhere: how many nodes each reason rejected, and a status for a pod-wide failure."""

    rejected: Mapping[str, int]
    nodes_considered: int
    pre_filter: Status | None = None

    @classmethod
    def of(cls, statuses: Iterable[Status], nodes_considered: int) -> Diagnosis:
        counts: dict[str, int] = {}
        for status in statuses:
            for reason in status.reasons or (status.code.value,):
                counts[reason] = counts.get(reason, 0) + 1
        return cls(counts, nodes_considered)

    @classmethod
    def whole_pod(cls, status: Status, nodes_considered: int) -> Diagnosis:
        return cls({}, nodes_considered, status)

    @property
    def reasons(self) -> tuple[str, ...]:
        if self.pre_filter is not None:
            return self.pre_filter.reasons
        return tuple(reason for reason, _ in self._ordered())

    def message(self) -> str:
        """e.g. ``insufficient GPU on 1,102 nodes; model not allowed on 96; unhealthy GPU on 3``."""
        if self.pre_filter is not None:
            return self.pre_filter.message()
        parts = []
        for position, (reason, count) in enumerate(self._ordered()):
            noun = (" node" if count == 1 else " nodes") if position == 0 else ""
            parts.append(f"{reason} on {count:,}{noun}")
        return "; ".join(parts) or f"no nodes among {self.nodes_considered:,}"

    def _ordered(self) -> list[tuple[str, int]]:
        return sorted(self.rejected.items(), key=lambda item: (-item[1], item[0]))
