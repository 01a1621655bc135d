"""What the cluster planner sees and decides with: GPUs and nodes as they are, its settings, and the
draft plan its passes (see :mod:`tessera.slicing.domain.cluster_plan`) grow together."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tessera.cluster.catalogue import GpuModel
from tessera.slicing.domain.layout import GpuLayout, MigSlice, PlanScore
from tessera.slicing.domain.time_slicing import DEFAULT_MAX_REPLICAS, PodUse
from tessera.slicing.domain.usage_history import UsageSettings

# pending MIG pods are counted by (profile, the GPU models they allow; empty for any)
MigWant = tuple[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU as the planner sees it: its current layout and what runs on it."""

    index: int
    model: GpuModel
    layout: GpuLayout
    held: frozenset[MigSlice] = frozenset()
    running_pods: int = 0
    used_milli: int = 0
    utilization_pct: float | None = None
    changed_s_ago: float | None = None
    #: the pods on the GPU, with their measured use where telemetry has enough of it
    pods: tuple[PodUse, ...] = ()

    def __post_init__(self) -> None:
        if self.running_pods < 0:
            raise ValueError(f"gpu {self.index}: running_pods must be >= 0, got {self.running_pods}")
        if not self.held.issubset(self.layout.mig):
            raise ValueError(f"gpu {self.index}: held slices must be slices of its layout {self.layout}")

    @property
    def busy(self) -> bool:
        return self.running_pods > 0 or bool(self.held)


@dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    gpus: tuple[GpuState, ...]
    pinned: bool = False  # the layout is set by hand (opt-out label): never planned
    schedulable: bool = True
    #: time-sliced under slicing's own config: the scheduler places a share on any free replica,
    #: whatever its milli (elsewhere shares also need the milli left within 1000)
    shares_by_replicas: bool = False


@dataclass(frozen=True, slots=True)
class PlannerSettings:
    reconfigure_minutes: float = 2.0
    benefit_horizon_minutes: float = 30.0
    hysteresis_ratio: float = 1.5
    min_dwell_s: float = 600.0
    max_replicas: int = DEFAULT_MAX_REPLICAS
    change_busy_gpus: bool = False
    prefer_mps: bool = True
    usage: UsageSettings = field(default_factory=UsageSettings)

    def worth_it(self, gpu_fraction_served: float) -> bool:
        benefit = gpu_fraction_served * self.benefit_horizon_minutes
        return benefit >= self.hysteresis_ratio * self.reconfigure_minutes


@dataclass(slots=True)
class PlanDraft:
    """The plan as it grows: desired layouts and their reasons, by (node, gpu index)."""

    nodes: Mapping[str, NodeState]
    settings: PlannerSettings
    desired: dict[tuple[str, int], tuple[GpuLayout, str, PlanScore]]
    # free GPUs already promised to pending pods as they are: no later pass may change them
    reserved: set[tuple[str, int]] = field(default_factory=set)

    def layout(self, node: str, gpu: GpuState) -> GpuLayout:
        entry = self.desired.get((node, gpu.index))
        return entry[0] if entry else gpu.layout

    def touched(self, node: str, gpu: GpuState) -> bool:
        return (node, gpu.index) in self.desired

    def set(self, node: str, gpu: GpuState, layout: GpuLayout, reason: str, score: PlanScore) -> None:
        self.desired[(node, gpu.index)] = (layout, reason, score)

    def may_change(self, node: NodeState, gpu: GpuState) -> bool:
        if node.pinned or not node.schedulable or self.touched(node.name, gpu):
            return False
        if (node.name, gpu.index) in self.reserved:
            return False
        if gpu.changed_s_ago is not None and gpu.changed_s_ago < self.settings.min_dwell_s:
            return False
        return not gpu.busy or self.settings.change_busy_gpus
