"""Nodes from Kubernetes dicts into the domain model, and the domain model back into a node manifest."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

from tessera.cluster.catalogue.migparted import UnknownMigConfig, mig_parted_layout
from tessera.cluster.catalogue.models import CATALOGUE, GpuModel, resolve_product
from tessera.cluster.catalogue.topologies import typical_board
from tessera.cluster.conventions import quantity
from tessera.cluster.conventions.inventory import decode_gpus, decode_topology, encode_gpus, encode_topology
from tessera.cluster.conventions.kube_dict import get, string_map
from tessera.cluster.conventions.names import (
    GPU_COUNT_LABEL,
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_REPLICAS_LABEL,
    GPU_RESOURCE,
    MIG_CONFIG_LABEL,
    MIG_CONFIG_STATE_LABEL,
    MIG_RESOURCE_PREFIX,
    MIG_STRATEGY_LABEL,
    NODE_GPUS_ANNOTATION,
    NODE_TOPOLOGY_ANNOTATION,
)
from tessera.cluster.domain.gpu import Gpu, MigInstance, MigMode, MigStrategy
from tessera.cluster.domain.node import MigConfigState, Node, Taint, TaintEffect
from tessera.cluster.domain.topology import InterconnectMatrix

E = TypeVar("E", MigConfigState, MigStrategy, TaintEffect)
_SINGLE_MIG_PRODUCT = re.compile(r"-MIG-(?P<profile>\d+g\.\d+gb(?:\+me)?)$")


def parse_node(obj: Mapping[str, Any]) -> Node:
    """A node dict into a Node; malformed fields raise ValueError naming the field.

    GPUs come from the ``tessera.io/gpus`` annotation when it is there. Otherwise they are built
    from GPU Feature Discovery labels (count, product, memory), with stable synthetic UUIDs
    (``GPU-<node>-<index>``) and, where a MIG config is applied, the layout it gives each GPU.
    """
    metadata = get(obj, "metadata", {})
    spec = get(obj, "spec", {})
    status = get(obj, "status", {})
    name = get(metadata, "name")
    if not name:
        raise ValueError("node.metadata.name: missing")
    labels = string_map(metadata, "labels", "node.metadata.labels")
    annotations = string_map(metadata, "annotations", "node.metadata.annotations")
    allocatable = get(status, "allocatable", {}) or get(status, "capacity", {}) or {}
    capacity = get(status, "capacity", {}) or {}
    extended = {
        key: quantity.count(value, f"node.status.allocatable[{key}]")
        for key, value in allocatable.items()
        if key == GPU_RESOURCE or key.startswith(MIG_RESOURCE_PREFIX)
    }
    mig_config = labels.get(MIG_CONFIG_LABEL) or None
    mig_state = _enum(MigConfigState, labels.get(MIG_CONFIG_STATE_LABEL), f"labels[{MIG_CONFIG_STATE_LABEL}]")
    strategy = _enum(MigStrategy, labels.get(MIG_STRATEGY_LABEL), f"labels[{MIG_STRATEGY_LABEL}]")
    replicas_text = labels.get(GPU_REPLICAS_LABEL, "1")
    try:
        replicas = max(1, int(replicas_text))
    except ValueError:
        raise ValueError(f"node.metadata.labels[{GPU_REPLICAS_LABEL}]: expected an integer") from None
    if NODE_GPUS_ANNOTATION in annotations:
        gpus = decode_gpus(annotations[NODE_GPUS_ANNOTATION])
    else:
        gpus = _gpus_from_labels(name, labels, capacity, replicas, mig_config, mig_state)
    if NODE_TOPOLOGY_ANNOTATION in annotations:
        interconnect: InterconnectMatrix | None = decode_topology(annotations[NODE_TOPOLOGY_ANNOTATION])
    elif gpus:
        interconnect = typical_board(gpus[0].model, max(g.index for g in gpus) + 1)
    else:
        interconnect = None
    return Node(
        name=name,
        allocatable_cpu_milli=quantity.cpu_milli(allocatable.get("cpu", 0), "node.status.allocatable.cpu"),
        allocatable_memory_mib=quantity.memory_mib(
            allocatable.get("memory", 0), "node.status.allocatable.memory"
        ),
        gpus=gpus,
        labels=labels,
        annotations=annotations,
        taints=tuple(_taint(t, f"node.spec.taints[{i}]") for i, t in enumerate(get(spec, "taints", []))),
        unschedulable=bool(get(spec, "unschedulable", False)),
        ready=_ready(status),
        interconnect=interconnect,
        mig_strategy=strategy or MigStrategy.NONE,
        mig_config=mig_config,
        mig_config_state=mig_state,
        gpu_replicas=replicas,
        extended_allocatable=extended,
        resource_version=get(metadata, "resourceVersion"),
    )


def node_manifest(node: Node) -> dict[str, Any]:
    """A Kubernetes Node object (camelCase dict) that :func:`parse_node` reads back as ``node``."""
    labels = dict(node.labels)
    annotations = dict(node.annotations)
    if node.gpus:
        first = node.gpus[0]
        labels.setdefault(GPU_PRODUCT_LABEL, first.model)
        labels.setdefault(GPU_COUNT_LABEL, str(len(node.gpus)))
        labels.setdefault(GPU_MEMORY_LABEL, str(first.memory_mib))
        annotations[NODE_GPUS_ANNOTATION] = encode_gpus(node.gpus)
    if node.interconnect is not None:
        annotations[NODE_TOPOLOGY_ANNOTATION] = encode_topology(node.interconnect)
    if node.mig_strategy is not MigStrategy.NONE:
        labels[MIG_STRATEGY_LABEL] = node.mig_strategy.value
    if node.mig_config:
        labels[MIG_CONFIG_LABEL] = node.mig_config
    if node.mig_config_state:
        labels[MIG_CONFIG_STATE_LABEL] = node.mig_config_state.value
    if node.gpu_replicas > 1:
        labels[GPU_REPLICAS_LABEL] = str(node.gpu_replicas)
    resources: dict[str, str] = {
        "cpu": f"{node.allocatable_cpu_milli}m",
        "memory": f"{node.allocatable_memory_mib}Mi",
        "pods": "110",
    }
    resources.update({key: str(value) for key, value in node.extended_allocatable.items()})
    spec: dict[str, Any] = {}
    if node.unschedulable:
        spec["unschedulable"] = True
    if node.taints:
        spec["taints"] = [{"key": t.key, "value": t.value, "effect": t.effect.value} for t in node.taints]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels, "annotations": annotations},
        "spec": spec,
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [{"type": "Ready", "status": "True" if node.ready else "False"}],
        },
    }


def _gpus_from_labels(
    name: str,
    labels: Mapping[str, str],
    capacity: Mapping[str, Any],
    replicas: int,
    mig_config: str | None,
    mig_state: MigConfigState | None,
) -> tuple[Gpu, ...]:
    """Physical GPUs from GFD labels.

    With MIG strategy ``single`` GFD rewrites ``gpu.count``, ``gpu.memory`` and ``gpu.product``
    (``A100-SXM4-40GB-MIG-1g.5gb``) to describe MIG devices; the physical GPUs are recovered from
    the profile and the layout each GPU carries. Time-slicing multiplies the capacity, not the count.
    """
    product = labels.get(GPU_PRODUCT_LABEL, "")
    single = _SINGLE_MIG_PRODUCT.search(product) if labels.get(MIG_STRATEGY_LABEL) == "single" else None
    count_text = labels.get(GPU_COUNT_LABEL)
    if count_text is not None:
        count = quantity.count(count_text, f"node.metadata.labels[{GPU_COUNT_LABEL}]")
    elif GPU_RESOURCE in capacity:
        count = quantity.count(capacity[GPU_RESOURCE], f"node.status.capacity[{GPU_RESOURCE}]")
        if single is None:
            count //= replicas
    else:
        count = 0
    if count == 0:
        return ()
    memory_text = labels.get(GPU_MEMORY_LABEL)
    memory = quantity.count(memory_text, f"node.metadata.labels[{GPU_MEMORY_LABEL}]") if memory_text else None
    if single is not None:
        memory = None  # the label gives the memory of one MIG device
    model = resolve_product(product, memory)
    layout = _applied_layout(model, mig_config, mig_state)
    if single is not None and model.mig is not None and model.mig.has_profile(single["profile"]):
        if layout is None or not layout[1]:
            profile = model.mig.profile(single["profile"])
            layout = (True, (profile.name,) * profile.max_instances)
        count = max(1, count // len(layout[1]))
    instances: tuple[MigInstance, ...] = ()
    if layout is not None and layout[1] and model.mig is not None:
        instances = model.mig.place(layout[1])
    return tuple(
        Gpu(
            index=index,
            uuid=f"GPU-{name}-{index}",
            model=model.name,
            memory_mib=memory if memory is not None else model.memory_mib,
            mig_mode=MigMode.ENABLED if layout is not None and layout[0] else MigMode.DISABLED,
            mig_instances=instances,
        )
        for index in range(count)
    )


def _applied_layout(
    model: GpuModel, mig_config: str | None, mig_state: MigConfigState | None
) -> tuple[bool, tuple[str, ...]] | None:
    """The MIG layout the node's GPUs are in: only once the MIG manager reports success (or says nothing)."""
    if mig_config is None or mig_state in (
        MigConfigState.PENDING,
        MigConfigState.REBOOTING,
        MigConfigState.FAILED,
    ):
        return None
    if model.name not in CATALOGUE:
        return None
    try:
        layout = mig_parted_layout(mig_config, model)
    except UnknownMigConfig:
        return None
    return layout.mig_enabled, layout.profiles


def _ready(status: Mapping[str, Any]) -> bool:
    for condition in get(status, "conditions", []) or []:
        if get(condition, "type") == "Ready":
            return bool(get(condition, "status") == "True")
    return True


def _taint(obj: Mapping[str, Any], field: str) -> Taint:
    key = get(obj, "key")
    if not key:
        raise ValueError(f"{field}.key: missing")
    effect = _enum(TaintEffect, get(obj, "effect"), f"{field}.effect")
    if effect is None:
        raise ValueError(f"{field}.effect: missing")
    return Taint(key=key, effect=effect, value=get(obj, "value", ""))


def _enum(kind: type[E], text: str | None, field: str) -> E | None:
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise ValueError(f"{field}: {text!r} is not one of {allowed}") from None
