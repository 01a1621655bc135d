"""The cluster as the planner sees it, and the plan as operations: pure translations both ways.

Nodes and the pods bound to them become `NodeState`s (current layout per GPU, what pods hold of
it); a `LayoutPlan` becomes one `NodeChange` per node, MIG first (a node's other changes wait for
the next round, as a node has one open operation at a time)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

import yaml

from tessera.cluster.catalogue import CATALOGUE
from tessera.cluster.conventions import DEVICE_PLUGIN_CONFIG_LABEL, GPU_SHARING_STRATEGY_LABEL
from tessera.cluster.conventions.device_plugin import time_sliced_by_slicing
from tessera.cluster.conventions.names import (
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    SLICING_DEVICE_PLUGIN_CONFIG_PREFIX,
)
from tessera.cluster.domain.gpu import MigMode
from tessera.cluster.domain.node import Node
from tessera.cluster.domain.requirements import GpuRequestKind, Pod
from tessera.slicing.domain.cluster_plan import GpuState, NodeState
from tessera.slicing.domain.layout import (
    GpuChange,
    GpuLayout,
    LayoutPlan,
    MigSlice,
    SharingMode,
    device_plugin_config,
    mig_config_name,
    mig_parted_entries,
    node_capacity,
)
from tessera.slicing.domain.operation import ChangeKind, GpuTarget, NodeChange
from tessera.slicing.domain.time_slicing import PodUse

#: a pod's measured use per minute (namespace/name -> series), None when it has too little history
UsageOf = Callable[[str], tuple[float, ...] | None]

#: a node labelled so keeps the layout someone set by hand: slicing never plans for it
PIN_LABEL = "tessera.io/slicing"
PIN_VALUE = "manual"
_KIND = {
    SharingMode.EXCLUSIVE: "exclusive",
    SharingMode.MIG: "mig",
    SharingMode.TIME_SLICING: "time_slicing",
    SharingMode.MPS: "mps",
}


@dataclass
class GpuUse:
    pods: set[str] = field(default_factory=set)
    milli: int = 0
    slices: set[MigSlice] = field(default_factory=set)
    milli_of: dict[str, int] = field(default_factory=dict)  # pod -> milli it holds of the GPU


def current_layouts(node: Node) -> dict[int, GpuLayout]:
    """Each GPU's layout as the node reports it (instances, and the device plugin's replicas)."""
    mps = node.labels.get(GPU_SHARING_STRATEGY_LABEL) == "mps"
    layouts: dict[int, GpuLayout] = {}
    for gpu in node.gpus:
        if gpu.mig_mode is MigMode.ENABLED:
            layouts[gpu.index] = GpuLayout.mig_geometry((i.profile, i.start) for i in gpu.mig_instances)
        elif node.gpu_replicas > 1:
            layouts[gpu.index] = (GpuLayout.mps if mps else GpuLayout.time_slicing)(node.gpu_replicas)
        else:
            layouts[gpu.index] = GpuLayout.exclusive()
    return layouts


def gpu_use(node: Node, pods: Iterable[Pod]) -> dict[str, GpuUse]:
    """What pods hold of each GPU (by UUID). A GPU pod whose devices are not known holds them all."""
    use = {gpu.uuid: GpuUse() for gpu in node.gpus}
    for pod in pods:
        if pod.requirements.gpu.kind is GpuRequestKind.NONE:
            continue
        name = f"{pod.namespace}/{pod.name}"
        if pod.assignment is None:
            for held in use.values():
                held.pods.add(name)
            continue
        for share in pod.assignment.shares:
            held = use.setdefault(share.gpu_uuid, GpuUse())
            held.pods.add(name)
            if share.mig is not None:
                held.slices.add(MigSlice(start=share.mig.start, profile=share.mig.profile))
            else:
                held.milli += share.milli
                held.milli_of[name] = held.milli_of.get(name, 0) + share.milli
    return use


def node_state(
    node: Node,
    pods: Iterable[Pod],
    changed_at: Mapping[int, datetime],
    now: datetime,
    usage: UsageOf | None = None,
) -> NodeState | None:
    """The planner's view of a node; None for a node without GPUs the catalogue knows. `usage` gives
    the measured use of the pods on time-sliced GPUs (see `domain.usage_history`)."""
    if not node.gpus or any(gpu.model not in CATALOGUE for gpu in node.gpus):
        return None
    layouts = current_layouts(node)
    use = gpu_use(node, pods)
    gpus = []
    for gpu in node.gpus:
        held = use.get(gpu.uuid, GpuUse())
        slices = frozenset(s for s in held.slices if s in layouts[gpu.index].mig)
        changed = changed_at.get(gpu.index)
        gpus.append(
            GpuState(
                index=gpu.index,
                model=CATALOGUE[gpu.model],
                layout=layouts[gpu.index],
                held=slices,
                running_pods=len(held.pods),
                used_milli=min(held.milli, 1000 * max(1, node.gpu_replicas)),
                changed_s_ago=None if changed is None else max(0.0, (now - changed).total_seconds()),
                pods=tuple(
                    PodUse(
                        name, max(1, min(1000, held.milli_of.get(name, 1000))), usage(name) if usage else None
                    )
                    for name in sorted(held.pods)
                ),
            )
        )
    return NodeState(
        name=node.name,
        gpus=tuple(gpus),
        pinned=node.labels.get(PIN_LABEL) == PIN_VALUE,
        shares_by_replicas=time_sliced_by_slicing(node.labels),
        schedulable=not node.unschedulable and node.ready,
    )


def node_changes(
    plan: LayoutPlan, nodes: Mapping[str, Node], busy: Mapping[str, frozenset[int]] | None = None
) -> list[NodeChange]:
    """One change per node the plan touches: its MIG GPUs if any, else its device-plugin sharing.
    A change to a GPU in `busy` (node -> GPU indexes pods hold) drains the node first."""
    result = []
    for name in plan.nodes:
        node = nodes.get(name)
        changes = [c for c in plan.for_node(name) if c.changed]
        if node is None or not changes:
            continue
        current = current_layouts(node)
        mig = [c for c in changes if SharingMode.MIG in (c.desired.mode, c.current.mode)]
        chosen = mig or changes
        desired = {c.gpu_index: c.desired for c in chosen}
        after = {**current, **desired}
        if mig:
            kind = ChangeKind.MIG
            config = mig_config_name(desired)
            body = yaml.safe_dump(mig_parted_entries(desired), sort_keys=False)
            previous = node.mig_config
        else:
            body = yaml.safe_dump(device_plugin_config(after), sort_keys=False)
            mps = any(layout.mode is SharingMode.MPS for layout in after.values())
            kind = ChangeKind.MPS if mps else ChangeKind.TIME_SLICING
            config = SLICING_DEVICE_PLUGIN_CONFIG_PREFIX + hashlib.sha256(body.encode()).hexdigest()[:12]
            previous = node.labels.get(DEVICE_PLUGIN_CONFIG_LABEL)
        uuids = {gpu.index: gpu.uuid for gpu in node.gpus}
        result.append(
            NodeChange(
                node=name,
                kind=kind,
                config=config,
                body=body,
                gpus=tuple(
                    GpuTarget(i, uuids[i], _KIND[layout.mode], layout.mig_profiles, layout.replicas)
                    for i, layout in sorted(desired.items())
                ),
                expected_resources=expected_resources(node, after),
                previous_config=previous,
                drain=bool(set(desired) & (busy or {}).get(name, frozenset())) and not grows_replicas(chosen),
                reason="; ".join(dict.fromkeys(c.reason for c in chosen)),
            )
        )
    return result


def grows_replicas(changes: Iterable[GpuChange]) -> bool:
    """Only more time-slicing replicas on GPUs already time-sliced: every running pod keeps its replica,
    so the node is not drained (a change without a drain is written at once, see `Operation`)."""
    changes = list(changes)
    return bool(changes) and all(
        c.current.mode is SharingMode.TIME_SLICING
        and c.desired.mode is SharingMode.TIME_SLICING
        and c.desired.replicas >= c.current.replicas
        for c in changes
    )


def expected_resources(node: Node, layouts: Mapping[int, GpuLayout]) -> dict[str, int]:
    """GPU resources the node will advertise: the layouts' capacity, and 0 for any it stops offering."""
    expected = {GPU_RESOURCE: 0, **node_capacity(layouts)}
    for name in node.extended_allocatable:
        if name.startswith(MIG_RESOURCE_PREFIX):
            expected.setdefault(name, 0)
    return expected
