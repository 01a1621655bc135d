"""Score plugins: rank feasible nodes from 0 to 100 (higher is better)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tessera.scheduler.domain.framework.cycle_state import CycleState, StateKey
from tessera.scheduler.domain.framework.interfaces import MAX_NODE_SCORE
from tessera.scheduler.domain.framework.pod import PodSpec, Policy
from tessera.scheduler.domain.framework.status import Status
from tessera.scheduler.domain.plugins.args import GangLocalityArgs, NodePolicyArgs
from tessera.scheduler.domain.plugins.filters import GPU_CHOICE
from tessera.scheduler.domain.plugins.gpu_choice import set_link
from tessera.scheduler.domain.snapshot import MILLI_PER_GPU, Link, NodeInfo, Snapshot

# Racks that already hold members of the pod's gang, found once per cycle.
GANG_RACKS: StateKey[frozenset[str]] = StateKey("GangLocality/racks")
# Nodes that already hold members of the pod's gang, found with the racks.
GANG_NODES: StateKey[frozenset[str]] = StateKey("GangLocality/nodes")

LINK_SCORE: dict[Link, int] = {
    Link.NVLINK: 100,
    Link.PCIE_SWITCH: 70,
    Link.PCIE_HOST: 40,
    Link.CROSS_NUMA: 10,
}


@dataclass(frozen=True)
class NodePolicyScore:
    """Node-level binpack (fill the busiest node that fits) or spread (the emptiest), by GPU share.

    Pods without GPUs are ranked by CPU share the same way.
    """

    node_local: ClassVar[bool] = True
    node_keys: ClassVar[tuple[StateKey[dict[str, Any]], ...]] = ()
    revision: ClassVar[int] = 0
    args: NodePolicyArgs = field(default_factory=NodePolicyArgs)
    name: str = "NodePolicy"

    def score(self, state: CycleState, pod: PodSpec, node: NodeInfo) -> int:
        if pod.gpu_count and node.gpu_count:
            capacity = node.gpu_count * MILLI_PER_GPU
            used_after = node.gpu_milli_used + pod.gpu_milli_total
        elif node.cpu_milli:
            capacity = node.cpu_milli
            used_after = node.cpu_used + pod.cpu_milli
        else:
            return 0
        fill = min(MAX_NODE_SCORE, MAX_NODE_SCORE * used_after // capacity)
        policy = pod.node_policy or self.args.default_policy
        return fill if policy is Policy.BINPACK else MAX_NODE_SCORE - fill


@dataclass(frozen=True)
class GpuTopologyScore:
    """How well the GPU set GpuFit chose on this node is wired: NVLink best, cross-NUMA worst."""

    node_local: ClassVar[bool] = True
    node_keys: ClassVar[tuple[StateKey[dict[str, Any]], ...]] = ()
    revision: ClassVar[int] = 0
    name: str = "GpuTopology"

    def score(self, state: CycleState, pod: PodSpec, node: NodeInfo) -> int:
        choice = state.read(GPU_CHOICE).get(node.name, ())
        if len(choice) < 2:
            return MAX_NODE_SCORE  # one GPU, or none: no link inside the set
        link = set_link(node.topology, tuple(index for index, _ in choice))
        return MAX_NODE_SCORE if link is None else LINK_SCORE[link]


@dataclass(frozen=True)
class GangLocalityScore:
    """A gang prefers fewer nodes: nodes holding its members first, then nodes in the same racks.

    A job that asks for node-level spread gets no locality preference.
    """

    args: GangLocalityArgs = field(default_factory=GangLocalityArgs)
    name: str = "GangLocality"

    def pre_filter(self, state: CycleState, pod: PodSpec, snapshot: Snapshot) -> Status:
        holding = snapshot.holding(pod.gang)
        racks = (snapshot.nodes[name].rack for name in holding)
        state.write(GANG_NODES, holding)
        state.write(GANG_RACKS, frozenset(rack for rack in racks if rack is not None))
        return Status.success()

    def sparse_score(self, state: CycleState, pod: PodSpec, nodes: Mapping[str, NodeInfo]) -> dict[str, int]:
        """:meth:`score` of the ``nodes`` that score above 0: those holding members, those in their racks."""
        if pod.node_policy is Policy.SPREAD:
            return {}
        scores = {name: self.args.same_node_score for name in state.read(GANG_NODES) if name in nodes}
        racks = state.read(GANG_RACKS)
        if racks:
            for name, node in nodes.items():
                if name not in scores and node.rack in racks:
                    scores[name] = self.args.same_rack_score
        return {name: score for name, score in scores.items() if score}

    def score(self, state: CycleState, pod: PodSpec, node: NodeInfo) -> int:
        if pod.node_policy is Policy.SPREAD:
            # The job asked to be spread across nodes: keeping its members together would undo that.
            return 0
        if pod.gang in node.gang_members:
            return self.args.same_node_score
        if node.rack is not None and node.rack in state.read(GANG_RACKS):
            return self.args.same_rack_score
        return 0
