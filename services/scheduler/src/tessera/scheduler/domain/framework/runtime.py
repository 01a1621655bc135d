"""The framework runner: runs each extension point's plugins in their configured order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tessera.scheduler.domain.framework.cycle_state import CycleState
from tessera.scheduler.domain.framework.interfaces import (
    MAX_NODE_SCORE,
    BindPlugin,
    FilterPlugin,
    PermitPlugin,
    PreFilterPlugin,
    ReservePlugin,
    ScorePlugin,
)
from tessera.scheduler.domain.framework.pod import PodSpec
from tessera.scheduler.domain.framework.status import Code, Diagnosis, Reason, Status
from tessera.scheduler.domain.snapshot import NodeInfo, Snapshot


@dataclass(frozen=True)
class WeightedScore:
    plugin: ScorePlugin
    weight: int = 1

    def __post_init__(self) -> None:
        if self.weight < 1:
            raise ValueError(f"score[{self.plugin.name}].weight: must be >= 1, got {self.weight}")


@dataclass(frozen=True)
class Profile:
    """Which plugins run at each extension point, in order."""

    pre_filter: Sequence[PreFilterPlugin] = ()
    filter: Sequence[FilterPlugin] = ()
    score: Sequence[WeightedScore] = ()
    reserve: Sequence[ReservePlugin] = ()
    permit: Sequence[PermitPlugin] = ()
    bind: Sequence[BindPlugin] = ()

    def __post_init__(self) -> None:
        for point in ("pre_filter", "filter", "reserve", "permit", "bind"):
            names = [plugin.name for plugin in getattr(self, point)]
            if len(names) != len(set(names)):
                raise ValueError(f"profile.{point}: a plugin is listed twice in {names}")


@dataclass(frozen=True)
class ScheduleResult:
    """The node chosen for a pod, or the diagnosis of why none fits."""

    node: str | None
    diagnosis: Diagnosis | None = None
    score: int = 0
    feasible_nodes: int = 0
    scores: dict[str, int] = field(default_factory=dict, repr=False)
    filtered: Diagnosis | None = None
    """With a node chosen: the nodes the filters rejected on the way, counted by reason."""

    @property
    def ok(self) -> bool:
        return self.node is not None


class Framework:
    def __init__(self, profile: Profile) -> None:
        self.profile = profile

    # -- scheduling cycle ----------------------------------------------------------------------

    def schedule_pod(self, state: CycleState, pod: PodSpec, snapshot: Snapshot) -> ScheduleResult:
        """PreFilter, Filter and Score over the snapshot; nothing is claimed yet (that is Reserve)."""
        nodes = snapshot.list()
        pre = self.run_pre_filter(state, pod, snapshot)
        if not pre.ok:
            return ScheduleResult(None, Diagnosis.whole_pod(pre, len(nodes)))
        filters = self._active_filters(state)
        feasible: list[NodeInfo] = []
        rejections: list[Status] = []
        for node in nodes:
            status = self._filter_node(filters, state, pod, node)
            if status.ok:
                feasible.append(node)
            else:
                rejections.append(status)
        if not feasible:
            return ScheduleResult(None, Diagnosis.of(rejections, len(nodes)))
        filtered = Diagnosis.of(rejections, len(nodes))
        if len(feasible) == 1:
            return ScheduleResult(feasible[0].name, feasible_nodes=1, filtered=filtered)
        totals = self.run_score(state, pod, feasible)
        # Ties go to the first node in snapshot order, so a decision is reproducible.
        best = max(feasible, key=lambda node: totals[node.name])
        return ScheduleResult(
            best.name, score=totals[best.name], feasible_nodes=len(feasible), scores=totals, filtered=filtered
        )

    def run_pre_filter(self, state: CycleState, pod: PodSpec, snapshot: Snapshot) -> Status:
        for plugin in self.profile.pre_filter:
            status = plugin.pre_filter(state, pod, snapshot)
            if status.code is Code.SKIP:
                state.skip_filter.add(plugin.name)
            elif not status.ok:
                return status.by(plugin.name)
        return Status.success()

    def run_filter(self, state: CycleState, pod: PodSpec, node: NodeInfo) -> Status:
        return self._filter_node(self._active_filters(state), state, pod, node)

    def _active_filters(self, state: CycleState) -> list[FilterPlugin]:
        return [plugin for plugin in self.profile.filter if plugin.name not in state.skip_filter]

    @staticmethod
    def _filter_node(
        filters: Sequence[FilterPlugin], state: CycleState, pod: PodSpec, node: NodeInfo
    ) -> Status:
        if not node.schedulable:
            return _NODE_UNSCHEDULABLE
        for plugin in filters:
            status = plugin.filter(state, pod, node)
            if status.code is not Code.SUCCESS:
                return status.by(plugin.name)
        return Status.success()

    def run_score(self, state: CycleState, pod: PodSpec, nodes: Sequence[NodeInfo]) -> dict[str, int]:
        totals = {node.name: 0 for node in nodes}
        for weighted in self.profile.score:
            plugin = weighted.plugin
            if plugin.name in state.skip_score:
                continue
            for node in nodes:
                score = plugin.score(state, pod, node)
                if not 0 <= score <= MAX_NODE_SCORE:
                    raise ValueError(f"plugin {plugin.name}: score {score} for {node.name} is outside 0..100")
                totals[node.name] += weighted.weight * score
        return totals

    # -- reserve, permit, bind -----------------------------------------------------------------

    def run_reserve(self, state: CycleState, pod: PodSpec, node: str) -> Status:
        """Reserve in order; on a failure every reserve plugin is unreserved, as kube-scheduler does."""
        for plugin in self.profile.reserve:
            status = plugin.reserve(state, pod, node)
            if not status.ok:
                self.run_unreserve(state, pod, node)
                return status.by(plugin.name)
        return Status.success()

    def run_unreserve(self, state: CycleState, pod: PodSpec, node: str) -> None:
        for plugin in reversed(self.profile.reserve):
            plugin.unreserve(state, pod, node)

    def run_permit(self, state: CycleState, pod: PodSpec, node: str) -> tuple[Status, float]:
        """Any rejection wins; else any Wait makes the pod wait for the shortest timeout asked."""
        wait: Status | None = None
        timeout = float("inf")
        for plugin in self.profile.permit:
            status, plugin_timeout = plugin.permit(state, pod, node)
            if status.code is Code.WAIT:
                wait = wait or status.by(plugin.name)
                timeout = min(timeout, plugin_timeout)
            elif status.rejected:
                return status.by(plugin.name), 0.0
        if wait is not None:
            return wait, timeout
        return Status.success(), 0.0

    def run_bind(self, state: CycleState, pod: PodSpec, node: str) -> Status:
        for plugin in self.profile.bind:
            status = plugin.bind(state, pod, node)
            if status.code is not Code.SKIP:
                return status.by(plugin.name)
        return Status.error("no bind plugin handled the pod")


_NODE_UNSCHEDULABLE = Status.unresolvable(Reason.NODE_UNSCHEDULABLE)
