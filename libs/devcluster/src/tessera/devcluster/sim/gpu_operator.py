"""What the NVIDIA GPU Operator makes of a node: GFD labels, device-plugin resources, MIG layouts.

Pure functions over the simulated hardware; the controller in `operator_controller` applies them.
The device plugin runs with the `mixed` MIG strategy: a MIG-enabled GPU is advertised as its
instances (`nvidia.com/mig-1g.10gb: 7` per GPU for `all-1g.10gb`), any other healthy GPU as
`nvidia.com/gpu` times the time-slicing replicas of the node's device-plugin config.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import yaml

from tessera.cluster.catalogue import CATALOGUE, UnknownMigConfig, mig_parted_layout, typical_board
from tessera.cluster.catalogue import model as catalogue_model
from tessera.cluster.conventions import (
    DEVICE_PLUGIN_CONFIG_LABEL,
    GPU_COUNT_LABEL,
    GPU_MEMORY_LABEL,
    GPU_PRESENT_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_REPLICAS_LABEL,
    GPU_RESOURCE,
    GPU_SHARING_STRATEGY_LABEL,
    MIG_CAPABLE_LABEL,
    MIG_STRATEGY_LABEL,
    NODE_GPUS_ANNOTATION,
    NODE_TOPOLOGY_ANNOTATION,
    encode_gpus,
    encode_topology,
    mig_count_label,
    mig_resource_name,
    time_slicing_config,
    time_slicing_replicas,
)
from tessera.cluster.domain.gpu import Gpu, GpuHealth, MigInstance, MigMode
from tessera.devcluster.sim import mig_parted
from tessera.devcluster.sim.state import SimGpu, SimNode

DEVICE_PLUGIN_NAMESPACE = "gpu-operator"
DEVICE_PLUGIN_CONFIGMAP = "device-plugin-config"
DEFAULT_DEVICE_PLUGIN_CONFIG = "default"

# The operands the MIG manager stops while it reconfigures, by their `nvidia.com/gpu.deploy.*` labels.
OPERAND_LABELS = (
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
    "nvidia.com/gpu.deploy.dcgm-exporter",
)
PAUSED_FOR_MIG_CHANGE = "paused-for-mig-change"

# The product strings GPU Feature Discovery reports for the catalogue's models.
PRODUCTS: dict[str, str] = {
    "A100-80GB": "NVIDIA-A100-SXM4-80GB",
    "A100-40GB": "NVIDIA-A100-SXM4-40GB",
    "H100-80GB": "NVIDIA-H100-80GB-HBM3",
    "H200-141GB": "NVIDIA-H200",
    "A30": "NVIDIA-A30",
    "A10": "NVIDIA-A10",
    "L4": "NVIDIA-L4",
    "T4": "Tesla-T4",
    "P100": "Tesla-P100-PCIE-16GB",
    "V100-16GB": "Tesla-V100-SXM2-16GB",
    "V100-32GB": "Tesla-V100-SXM2-32GB",
}


def default_device_plugin_configs() -> dict[str, str]:
    """The ConfigMap data: no sharing by default, and time-slicing configs by replica count."""
    data = {DEFAULT_DEVICE_PLUGIN_CONFIG: "version: v1\n"}
    for replicas in (2, 4, 8):
        data[f"ts-{replicas}"] = time_slicing_config(replicas)
    return data


def mig_parted_configmap() -> dict[str, Any]:
    """The MIG manager's ConfigMap, with no named config yet (the built-in names still apply)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": mig_parted.MIG_PARTED_CONFIGMAP, "namespace": DEVICE_PLUGIN_NAMESPACE},
        "data": {mig_parted.MIG_PARTED_KEY: "version: v1\nmig-configs: {}\n"},
    }


def device_plugin_configmap() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": DEVICE_PLUGIN_CONFIGMAP, "namespace": DEVICE_PLUGIN_NAMESPACE},
        "data": default_device_plugin_configs(),
    }


def replicas_for(labels: dict[str, str], configmap_data: dict[str, str] | None) -> int:
    """Replicas of `nvidia.com/gpu` for a node (time-slicing or MPS): its label picks a config of the ConfigMap."""
    return sharing_for(labels, configmap_data)[1]


def sharing_for(labels: dict[str, str], configmap_data: dict[str, str] | None) -> tuple[str, int]:
    """(strategy, replicas) of the node's device-plugin config: `none`, `time-slicing` or `mps`."""
    data = configmap_data or {}
    name = labels.get(DEVICE_PLUGIN_CONFIG_LABEL, DEFAULT_DEVICE_PLUGIN_CONFIG)
    text = data.get(name)
    if text is None:
        return "none", 1  # the device plugin keeps its last good config; with none, it does not share
    try:
        sliced = time_slicing_replicas(text).get(GPU_RESOURCE, 1)
        mps = _mps_replicas(text)
    except ValueError:
        return "none", 1
    if mps > 1:
        return "mps", mps
    return ("time-slicing", sliced) if sliced > 1 else ("none", 1)


def _mps_replicas(text: str) -> int:
    """Replicas of `nvidia.com/gpu` under `sharing.mps` (the device plugin's MPS control daemon)."""
    body = yaml.safe_load(text) or {}
    sharing = body.get("sharing") if isinstance(body, dict) else None
    mps = sharing.get("mps") if isinstance(sharing, dict) else None
    resources = mps.get("resources") if isinstance(mps, dict) else None
    for item in resources if isinstance(resources, list) else []:
        if isinstance(item, dict) and item.get("name") == GPU_RESOURCE:
            replicas = item.get("replicas")
            if not isinstance(replicas, int) or replicas < 1:
                raise ValueError("sharing.mps.resources[].replicas: expected an integer >= 1")
            return replicas
    return 1


def mig_layout(
    node: SimNode, config: str, mig_configs: dict[str, str] | None = None
) -> list[tuple[bool, tuple[MigInstance, ...]]]:
    """Per-GPU (MIG enabled, instances) for a mig-parted config: a named config of the MIG manager's
    ConfigMap (`mig_configs`, per-device entries; unlisted GPUs keep their layout) or one of the
    operator's built-in names. UnknownMigConfig or ValueError when it does not apply to the node."""
    entries = mig_parted.entries_for(mig_configs, config)
    if entries is not None:
        return _per_device_layout(node, entries)
    result = []
    for gpu in node.gpus:
        entry = catalogue_model(gpu.model)
        layout = mig_parted_layout(config, entry)
        if layout.profiles and entry.mig is not None:
            result.append((True, entry.mig.place(layout.profiles)))
        else:
            result.append((layout.mig_enabled, ()))
    return result


def _per_device_layout(
    node: SimNode, entries: tuple[mig_parted.DeviceEntry, ...]
) -> list[tuple[bool, tuple[MigInstance, ...]]]:
    listed = mig_parted.listed_devices(entries, len(node.gpus))
    result: list[tuple[bool, tuple[MigInstance, ...]]] = []
    for gpu in node.gpus:
        wanted = mig_parted.entry_profiles(entries, gpu.index, gpu.model) if gpu.index in listed else None
        if wanted is None:
            result.append((gpu.mig_enabled, gpu.mig_instances))
            continue
        enabled, profiles = wanted
        geometry = catalogue_model(gpu.model).mig
        try:
            instances = geometry.place(profiles) if profiles and geometry is not None else ()
        except ValueError as exc:
            raise ValueError(f"GPU {gpu.index} ({gpu.model}): {exc}") from None
        result.append((enabled, instances))
    return result


def advertised_resources(gpus: list[SimGpu], replicas: int) -> dict[str, int]:
    """Extended resources of the node: unhealthy and lost GPUs are withdrawn, as the plugin does."""
    if not gpus:
        return {}  # no GPU, no device plugin on the node
    resources: Counter[str] = Counter()
    whole = 0
    for gpu in gpus:
        if not gpu.healthy:
            continue
        if gpu.mig_enabled:
            for instance in gpu.mig_instances:
                resources[mig_resource_name(instance.profile)] += 1
        else:
            whole += 1
    resources[GPU_RESOURCE] = whole * replicas
    return dict(resources)


def product_label(model_name: str, shared: bool) -> str:
    product = PRODUCTS.get(model_name, model_name)
    return f"{product}-SHARED" if shared else product


def gpu_inventory(node: SimNode) -> list[Gpu]:
    return [
        Gpu(
            index=g.index,
            uuid=g.uuid,
            model=g.model,
            memory_mib=g.memory_mib,
            health=GpuHealth.HEALTHY if g.healthy else GpuHealth.UNHEALTHY,
            mig_mode=MigMode.ENABLED if g.mig_enabled else MigMode.DISABLED,
            mig_instances=g.mig_instances if g.mig_enabled else (),
            numa_node=0 if g.index < max(1, len(node.gpus) // 2) else 1,
        )
        for g in node.gpus
        if not g.lost
    ]


def operator_labels(node: SimNode, replicas: int, strategy: str | None = None) -> dict[str, str | None]:
    """GFD labels (None removes a label)."""
    if not node.gpus:
        return {}
    first = node.gpus[0]
    visible = [g for g in node.gpus if not g.lost]
    labels: dict[str, str | None] = {
        GPU_PRESENT_LABEL: "true",
        GPU_PRODUCT_LABEL: product_label(first.model, replicas > 1),
        GPU_COUNT_LABEL: str(len(visible)),
        GPU_MEMORY_LABEL: str(first.memory_mib),
        GPU_REPLICAS_LABEL: str(replicas),
        GPU_SHARING_STRATEGY_LABEL: strategy or ("time-slicing" if replicas > 1 else "none"),
        MIG_CAPABLE_LABEL: "true"
        if first.model in CATALOGUE and CATALOGUE[first.model].mig_capable
        else "false",
        MIG_STRATEGY_LABEL: "mixed",
    }
    counts = Counter(i.profile for g in visible if g.mig_enabled for i in g.mig_instances)
    for profile in {i.profile for entry in CATALOGUE.values() if entry.mig for i in _all_profiles(entry)}:
        labels[mig_count_label(profile)] = str(counts[profile]) if counts.get(profile) else None
    return labels


def _all_profiles(entry: Any) -> list[MigInstance]:
    return [MigInstance(p.name, 0) for p in entry.mig.profiles]


def operator_annotations(node: SimNode) -> dict[str, str]:
    annotations = {NODE_GPUS_ANNOTATION: encode_gpus(gpu_inventory(node))}
    if node.gpus:
        annotations[NODE_TOPOLOGY_ANNOTATION] = encode_topology(
            typical_board(node.gpus[0].model, len(node.gpus))
        )
    return annotations


def validate_mig_config(node: SimNode, config: str, mig_configs: dict[str, str] | None = None) -> str | None:
    """None when the config applies to every GPU of the node, else the reason it does not."""
    try:
        mig_layout(node, config, mig_configs)
    except (UnknownMigConfig, ValueError) as exc:
        return str(exc)
    return None
