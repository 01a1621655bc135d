"""The NVIDIA device plugin's sharing config, held in a ConfigMap and chosen per node by a label.

The GPU Operator points the device plugin at a ConfigMap (``devicePlugin.config.name``) whose keys
are named configs; the node label ``nvidia.com/device-plugin.config`` picks one for the node. A
time-slicing config looks like::

    version: v1
    sharing:
      timeSlicing:
        resources:
        - name: nvidia.com/gpu
          replicas: 4
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from tessera.cluster.conventions.names import (
    DEVICE_PLUGIN_CONFIG_LABEL,
    GPU_RESOURCE,
    GPU_SHARING_STRATEGY_LABEL,
    SLICING_DEVICE_PLUGIN_CONFIG_PREFIX,
)


def time_slicing_config(replicas: Mapping[str, int] | int, *, rename_by_default: bool = False) -> str:
    """Render a device-plugin config that time-slices each resource into ``replicas`` shares."""
    per_resource = {GPU_RESOURCE: replicas} if isinstance(replicas, int) else dict(replicas)
    resources = []
    for name, count in sorted(per_resource.items()):
        if count < 1:
            raise ValueError(f"sharing.timeSlicing.resources[{name}].replicas: must be >= 1, got {count}")
        resources.append({"name": name, "replicas": count})
    body: dict[str, Any] = {
        "version": "v1",
        "sharing": {"timeSlicing": {"renameByDefault": rename_by_default, "resources": resources}},
    }
    return yaml.safe_dump(body, sort_keys=False)


def time_slicing_replicas(config: str) -> dict[str, int]:
    """Replicas per resource from a device-plugin config; empty when it does not time-slice."""
    try:
        body = yaml.safe_load(config) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"device-plugin config: not YAML ({exc})") from None
    if not isinstance(body, dict):
        raise ValueError("device-plugin config: expected a mapping at the top level")
    sharing = body.get("sharing") or {}
    slicing = sharing.get("timeSlicing") or {} if isinstance(sharing, dict) else {}
    resources = slicing.get("resources") or [] if isinstance(slicing, dict) else []
    if not isinstance(resources, list):
        raise ValueError("sharing.timeSlicing.resources: expected a list")
    result: dict[str, int] = {}
    for i, item in enumerate(resources):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ValueError(f"sharing.timeSlicing.resources[{i}].name: expected a string")
        replicas = item.get("replicas")
        if not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"sharing.timeSlicing.resources[{i}].replicas: expected an integer >= 1")
        result[item["name"]] = replicas
    return result


def time_sliced_by_slicing(labels: Mapping[str, str]) -> bool:
    """The node's GPUs are time-sliced (GFD's sharing strategy) under a config slicing wrote: the
    scheduler places shares there by free replicas, as the device plugin does (ADR 0021)."""
    return labels.get(GPU_SHARING_STRATEGY_LABEL) == "time-slicing" and labels.get(
        DEVICE_PLUGIN_CONFIG_LABEL, ""
    ).startswith(SLICING_DEVICE_PLUGIN_CONFIG_PREFIX)
