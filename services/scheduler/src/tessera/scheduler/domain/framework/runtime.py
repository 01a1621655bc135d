"""The framework runner: runs each extension point's plugins in their configured order."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, cast

from tessera.scheduler.domain.framework.cycle_state import CycleState
from tessera.scheduler.domain.framework.interfaces import (
    MAX_NODE_SCORE,
    BindPlugin,
    FilterPlugin,
    NodeLocal,
    PermitPlugin,
    PreFilterPlugin,
    PreScorePlugin,
    ReservePlugin,
    ScorePlugin,
    SparseScorePlugin,
)
from tessera.scheduler.domain.framework.pod import PodSpec
from tessera.scheduler.domain.framework.status import Code, Diagnosis, Reason, Status
from tessera.scheduler.domain.framework.verdicts import DEFAULT_MAX_VERDICTS, NodeVerdict, VerdictCache
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
    """Runs a profile. ``max_verdicts`` bounds the node-local verdicts kept across cycles (see
    :mod:`.verdicts`); 0 keeps none, so every node is filtered and scored afresh for every pod."""

    def __init__(self, profile: Profile, max_verdicts: int = DEFAULT_MAX_VERDICTS) -> None:
        self.profile = profile
        self._verdicts = VerdictCache(max_verdicts) if max_verdicts else None
        plugins = [*profile.filter, *(weighted.plugin for weighted in profile.score)]
        # What each plugin implements, found once (a runtime protocol check is slow).
        self._node_local = {id(plugin) for plugin in plugins if _node_local(plugin)}
        self._pre_scores = {id(plugin) for plugin in plugins if isinstance(plugin, PreScorePlugin)}
        self._sparse = {id(plugin) for plugin in plugins if isinstance(plugin, SparseScorePlugin)}

    # -- scheduling cycle ----------------------------------------------------------------------

    def schedule_pod(self, state: CycleState, pod: PodSpec, snapshot: Snapshot) -> ScheduleResult:
        """PreFilter, Filter, PreScore and Score over the snapshot; nothing is claimed yet (that is Reserve)."""
        pre = self.run_pre_filter(state, pod, snapshot)
        if not pre.ok:
            return ScheduleResult(None, Diagnosis.whole_pod(pre, len(snapshot.nodes)))
        filters = self._active_filters(state)
        scores = [w for w in self.profile.score if w.plugin.name not in state.skip_score]
        if self._verdicts is None or not all(id(plugin) in self._node_local for plugin in filters):
            return self._schedule_afresh(state, pod, snapshot, filters)
        local = [w for w in scores if id(w.plugin) in self._node_local]
        live = [w for w in scores if id(w.plugin) not in self._node_local]
        view = self._verdicts.for_shape(_shape(pod, state, local), len(snapshot.nodes))
        keys = tuple(dict.fromkeys(key for plugin in filters for key in cast(NodeLocal, plugin).node_keys))
        notes = [state.read(key) for key in keys]
        single = notes[0] if len(notes) == 1 else None
        nodes = snapshot.nodes
        verdicts = view.verdicts
        for name in view.stale(snapshot):
            node = nodes.get(name)
            kept = verdicts.get(name)
            if node is None:
                if kept is not None:
                    view.put(name, None)
            elif kept is None or kept.node is not node:
                status = self._filter_node(filters, state, pod, node)
                recorded: tuple[tuple[int, Any], ...]
                if single is not None:  # the usual case: GpuFit's choice alone
                    recorded = ((0, single[name]),) if name in single else ()
                else:
                    recorded = tuple((i, noted[name]) for i, noted in enumerate(notes) if name in noted)
                view.put(name, NodeVerdict(node, None if status.ok else status, recorded))
        view.seen(snapshot)
        for noted, kept_notes in zip(notes, view.notes, strict=False):
            noted.update(kept_notes)
        filtered = Diagnosis(dict(view.rejected), len(nodes))
        feasible = view.feasible
        if not feasible:
            return ScheduleResult(None, filtered)
        if len(feasible) == 1:
            return ScheduleResult(next(iter(feasible)), feasible_nodes=1, filtered=filtered)
        if view.unscored:
            # in snapshot order, as every node afresh would score them
            order = snapshot.positions()
            unscored = [feasible[name] for name in sorted(view.unscored, key=order.__getitem__)]
            for name, total in self._score(state, pod, unscored, local).items():
                view.score(name, total)
        totals = dict(view.scores)
        if live:
            self._score(state, pod, list(feasible.values()), live, totals, MappingProxyType(feasible))
        top = max(totals.values())
        best = [name for name, total in totals.items() if total == top]
        # Ties go to the first node in snapshot order, so a decision is reproducible.
        chosen = best[0] if len(best) == 1 else min(best, key=snapshot.positions().__getitem__)
        return ScheduleResult(
            chosen, score=top, feasible_nodes=len(feasible), scores=totals, filtered=filtered
        )

    def _schedule_afresh(
        self, state: CycleState, pod: PodSpec, snapshot: Snapshot, filters: Sequence[FilterPlugin]
    ) -> ScheduleResult:
        nodes = snapshot.list()
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
        return self._best(feasible, self.run_score(state, pod, feasible), filtered)

    @staticmethod
    def _best(feasible: Sequence[NodeInfo], totals: dict[str, int], filtered: Diagnosis) -> ScheduleResult:
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
        scores = [w for w in self.profile.score if w.plugin.name not in state.skip_score]
        return self._score(state, pod, nodes, scores)

    def _score(
        self,
        state: CycleState,
        pod: PodSpec,
        nodes: Sequence[NodeInfo],
        scores: Sequence[WeightedScore],
        totals: dict[str, int] | None = None,
        by_name: Mapping[str, NodeInfo] | None = None,
    ) -> dict[str, int]:
        """PreScore, then the weighted sum of the ``scores`` of each node, added to ``totals`` when
        given (which then names every node of ``nodes``, as ``by_name`` does when given)."""
        for weighted in scores:
            if id(weighted.plugin) in self._pre_scores:
                status = cast(PreScorePlugin, weighted.plugin).pre_score(state, pod, nodes)
                if not status.ok:
                    raise ValueError(f"plugin {weighted.plugin.name}: pre_score failed: {status.message()}")
        if totals is None:
            totals = {node.name: 0 for node in nodes}
        for weighted in scores:
            plugin, weight = weighted.plugin, weighted.weight
            if id(plugin) not in self._sparse:
                score_of = plugin.score
                for node in nodes:  # every name is among the totals: they were made from the nodes
                    score = score_of(state, pod, node)
                    if not 0 <= score <= MAX_NODE_SCORE:
                        raise ValueError(
                            f"plugin {plugin.name}: score {score} for {node.name} is outside 0..100"
                        )
                    totals[node.name] += weight * score
                continue
            by_name = by_name if by_name is not None else {node.name: node for node in nodes}
            for name, score in cast(SparseScorePlugin, plugin).sparse_score(state, pod, by_name).items():
                if not 0 <= score <= MAX_NODE_SCORE:
                    raise ValueError(f"plugin {plugin.name}: score {score} for {name} is outside 0..100")
                if name not in totals:
                    raise ValueError(
                        f"plugin {plugin.name}: scored {name}, which is not among the nodes scored"
                    )
                totals[name] += weight * score
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


def _node_local(plugin: object) -> bool:
    return isinstance(plugin, NodeLocal) and plugin.node_local


def _shape(pod: PodSpec, state: CycleState, local: Sequence[WeightedScore]) -> Hashable:
    """Everything a node-local plugin may read of the pod and the cycle: its shape, the plugins
    taken out by PreFilter, and the revision of each node-local score."""
    return (
        pod.gpu_count,
        pod.gpu_milli,
        pod.cpu_milli,
        pod.memory_mib,
        pod.gpu_models,
        tuple(sorted(pod.mig.items())),
        pod.node_policy,
        pod.gpu_policy,
        pod.node_selector,
        pod.tolerations,
        pod.node_affinity,
        frozenset(state.skip_filter),
        frozenset(state.skip_score),
        tuple((w.plugin.name, w.weight, cast(NodeLocal, w.plugin).revision) for w in local),
    )
