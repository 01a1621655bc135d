"""Filter plugins: can this node hold the pod? Each rejection names its reason for the diagnosis."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tessera.cluster.conventions.names import GPU_REPLICAS_LABEL, GPU_SHARING_STRATEGY_LABEL
from tessera.cluster.domain.affinity import affinity_matches
from tessera.scheduler.domain.framework.cycle_state import CycleState, StateKey
from tessera.scheduler.domain.framework.pod import PodSpec, Policy
from tessera.scheduler.domain.framework.status import Code, Reason, Status
from tessera.scheduler.domain.plugins.args import GpuFitArgs
from tessera.scheduler.domain.plugins.gpu_choice import GpuSet, choose_gpus
from tessera.scheduler.domain.plugins.mig_offer import mig_offer
from tessera.scheduler.domain.snapshot import MILLI_PER_GPU, NodeInfo, Snapshot

# GPU set chosen by GpuFit per feasible node; Score ranks it and Reserve claims it.
GPU_CHOICE: StateKey[dict[str, GpuSet]] = StateKey("GpuFit/choice")


@dataclass(frozen=True)
class NodeResourcesFit:
    """CPU and memory fit in what the node has left."""

    node_local: ClassVar[bool] = True
    node_keys: ClassVar[tuple[StateKey[dict[str, Any]], ...]] = ()
    revision: ClassVar[int] = 0
    name: str = "NodeResourcesFit"

    def filter(self, state: CycleState, pod: PodSpec, node: NodeInfo) -> Status:
        if pod.cpu_milli > node.cpu_milli - node.cpu_used:
            return Status.unschedulable(Reason.INSUFFICIENT_CPU)
        if pod.memory_mib > node.memory_mib - node.memory_used:
            return Status.unschedulable(Reason.INSUFFICIENT_MEMORY)
        return Status.success()


@dataclass(frozen=True)
class GpuModelFilter:
    """The node has GPUs of a model the pod allows (``gpu_models`` empty allows any)."""

    node_local: ClassVar[bool] = True
    node_keys: ClassVar[tuple[StateKey[dict[str, Any]], ...]] = ()
    revision: ClassVar[int] = 0
    name: str = "GpuModel"

    def pre_filter(self, state: CycleState, pod: PodSpec, snapshot: Snapshot) -> Status:
        return Status.skip() if pod.gpu_count == 0 or not pod.gpu_models else Status.success()

    def filter(self, state: CycleState, pod: PodSpec, node: NodeInfo) -> Status:
        if any(gpu.model in pod.gpu_models for gpu in node.gpus):
            return Status.success()
        return Status.unresolvable(Reason.MODEL_NOT_ALLOWED)


@dataclass(frozen=True)
class NodeConstraints:
    """The pod's ``nodeSelector``, required node affinity and tolerations, as kube-scheduler's
    NodeAffinity and TaintToleration filters: every selector label on the node, one of the required
    nodeSelectorTerms matched, every NoSchedule or NoExecute taint tolerated."""

    node_local: ClassVar[bool] = True
    node_keys: ClassVar[tuple[StateKey[dict[str, Any]], ...]] = ()
    revision: ClassVar[int] = 0
    name: str = "NodeConstraints"

    def filter(self, state: CycleState, pod: PodSpec, node: NodeInfo) -> Status:
        if not (pod.node_selector or pod.node_affinity or node.taints):
            return Status.success()  # nothing to match, nothing to tolerate
        for key, value in pod.node_selector:
            if node.labels.get(key) != value:
                return Status.unresolvable(Reason.NODE_SELECTOR_MISMATCH)
        if not affinity_matches(pod.node_affinity, node.labels, node.name):
            return Status.unresolvable(Reason.NODE_AFFINITY_MISMATCH)
        for taint in node.taints:
            if not any(t.tolerates(taint) for t in pod.tolerations):
                return Status.unresolvable(f"{Reason.UNTOLERATED_TAINT} {taint.key}")
        return Status.success()


@dataclass(frozen=True)
class MigResourceFilter:
    """Free MIG devices of each requested profile (``nvidia.com/mig-<profile>``) on the node."""

    node_local: ClassVar[bool] = True
    node_keys: ClassVar[tuple[StateKey[dict[str, Any]], ...]] = ()
    revision: ClassVar[int] = 0
    name: str = "MigResources"

    def pre_filter(self, state: CycleState, pod: PodSpec, snapshot: Snapshot) -> Status:
        """A profile that no GPU model of the cluster offers can never be placed, nor made by slicing:
        say which profile and which models, once, instead of rejecting every node."""
        if not pod.mig:
            return Status.skip()
        offer = mig_offer(snapshot)
        for profile in pod.mig:
            if offer.never(profile):
                models = ", ".join(sorted(offer.models)) or "no GPU model known"
                return Status.unresolvable(
                    f"MIG profile {profile} is offered by no GPU model in the cluster ({models})"
                )
        return Status.success()

    def filter(self, state: CycleState, pod: PodSpec, node: NodeInfo) -> Status:
        for profile, count in pod.mig.items():
            if node.mig_free(profile) < count:
                return Status.unschedulable(f"{Reason.INSUFFICIENT_MIG} {profile}")
        return Status.success()


@dataclass(frozen=True)
class GpuFit:
    """Enough healthy GPUs of an allowed model, and the best set of them under the GPU policy.

    A node that would fit if its unhealthy GPUs were healthy is rejected for "unhealthy GPU", so the
    diagnosis tells a capacity shortage from a health problem.
    """

    node_local: ClassVar[bool] = True
    node_keys: ClassVar[tuple[StateKey[dict[str, Any]], ...]] = (GPU_CHOICE,)
    revision: ClassVar[int] = 0
    args: GpuFitArgs = field(default_factory=GpuFitArgs)
    name: str = "GpuFit"
    _chosen: dict[Hashable, tuple[NodeInfo, GpuSet | None]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """The GPUs chosen on a node for a GPU request, kept with the node state they were chosen on:
    pods of other shapes (CPU, memory) asking the same GPUs of an unchanged node get the same set."""

    def policy(self, pod: PodSpec) -> Policy:
        return pod.gpu_policy or self.args.default_policy

    def pre_filter(self, state: CycleState, pod: PodSpec, snapshot: Snapshot) -> Status:
        state.write(GPU_CHOICE, {})
        if not pod.gpu_count:
            return Status.skip()
        most = snapshot.totals.max_idle_gpus_on_a_node
        if not pod.fractional and pod.gpu_count > most:
            # No node has that many idle GPUs, healthy or not: every node would say "insufficient GPU".
            nodes = snapshot.totals.schedulable_nodes
            return Status.unschedulable(
                f"{Reason.INSUFFICIENT_GPU} on all {nodes:,} schedulable nodes "
                f"(needs {pod.gpu_count} idle GPUs, at most {most} on a node)"
            )
        return Status.success()

    def filter(self, state: CycleState, pod: PodSpec, node: NodeInfo) -> Status:
        limit = mps_client_milli(node)
        if pod.gpu_count and limit is not None and pod.gpu_milli > limit:
            return _OVER_MPS_CLIENT
        if not self._may_fit(pod, node):
            return self._rejection(pod, node)
        choice = self._choose(pod, node)
        if choice is None:
            return self._rejection(pod, node)
        state.read(GPU_CHOICE)[node.name] = choice
        return Status.success()

    def _choose(self, pod: PodSpec, node: NodeInfo) -> GpuSet | None:
        """:func:`choose_gpus`, remembered per node and GPU request until the node changes."""
        policy = self.policy(pod)
        key = (node.name, pod.gpu_count, pod.gpu_milli, pod.gpu_models, policy)
        kept = self._chosen.get(key)
        if kept is not None and kept[0] is node:
            return kept[1]
        choice = choose_gpus(pod, node, policy, self.args.exhaustive_limit)
        if len(self._chosen) >= MAX_KEPT_CHOICES:
            self._chosen.clear()
        self._chosen[key] = (node, choice)
        return choice

    def _may_fit(self, pod: PodSpec, node: NodeInfo) -> bool:
        """A cheap bound from the node's counters; only a node that passes it is searched."""
        if pod.fractional:
            return node.free_replica or node.max_idle_healthy_milli >= pod.gpu_milli
        return node.free_whole_gpus >= pod.gpu_count

    def _rejection(self, pod: PodSpec, node: NodeInfo) -> Status:
        if node.has_unhealthy and _fits_ignoring_health(pod, node):
            return _UNHEALTHY
        return _INSUFFICIENT


# GPU sets kept in all by GpuFit (a few hundred bytes each); forgotten all at once past this many.
MAX_KEPT_CHOICES = 100_000

_INSUFFICIENT = Status(Code.UNSCHEDULABLE, (Reason.INSUFFICIENT_GPU,), "GpuFit")
_OVER_MPS_CLIENT = Status(Code.UNSCHEDULABLE, (Reason.OVER_MPS_CLIENT_LIMIT,), "GpuFit")
_UNHEALTHY = Status(Code.UNSCHEDULABLE, (Reason.UNHEALTHY_GPU,), "GpuFit")


def mps_client_milli(node: NodeInfo) -> int | None:
    """The share of a GPU each client gets on a node whose device plugin shares GPUs under MPS.

    The device plugin advertises each GPU as ``nvidia.com/gpu.replicas`` clients and gives each an
    equal part of the GPU's memory and SMs, enforced per client; so a pod whose share (or whole GPU)
    is larger than that part cannot run there. None when the node does not share by MPS.
    """
    if node.labels.get(GPU_SHARING_STRATEGY_LABEL) != "mps":
        return None
    try:
        replicas = int(node.labels.get(GPU_REPLICAS_LABEL, "1"))
    except ValueError:
        return None  # the cluster model refuses such a node before it gets here
    return MILLI_PER_GPU // replicas if replicas > 1 else None


def _fits_ignoring_health(pod: PodSpec, node: NodeInfo) -> bool:
    usable = [gpu for gpu in node.gpus if not gpu.mig and (not pod.gpu_models or gpu.model in pod.gpu_models)]
    if pod.fractional:
        return any(gpu.fits(pod.gpu_milli) for gpu in usable)
    return sum(1 for gpu in usable if gpu.fully_idle) >= pod.gpu_count
