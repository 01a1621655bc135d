"""The MIG manager's config file, as mig-parted reads it from the ConfigMap the GPU Operator names
(`migManager.config.name`, key `config.yaml`)::

    version: v1
    mig-configs:
      tessera-1a2b3c:
        - devices: [1]            # per-device entries; `all` for every GPU
          mig-enabled: true
          mig-devices: {"3g.40gb": 2}
        - devices: [0, 2]
          mig-enabled: false

A GPU no entry lists is left as it is. Pure: parsing and the per-GPU layout a named config gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from tessera.cluster.catalogue import model as catalogue_model

MIG_PARTED_CONFIGMAP = "custom-mig-config"
MIG_PARTED_KEY = "config.yaml"


@dataclass(frozen=True)
class DeviceEntry:
    """One entry of a named config: which GPUs, MIG on or off, and the instances by profile."""

    devices: tuple[int, ...] | None  # None: all
    mig_enabled: bool
    mig_devices: tuple[tuple[str, int], ...] = ()

    def covers(self, index: int) -> bool:
        return self.devices is None or index in self.devices

    @property
    def profiles(self) -> tuple[str, ...]:
        return tuple(name for name, count in self.mig_devices for _ in range(count))


def parse_mig_parted(text: str) -> dict[str, tuple[DeviceEntry, ...]]:
    """Named configs of a mig-parted file; ValueError naming the field for anything malformed."""
    try:
        body = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{MIG_PARTED_KEY}: not YAML ({exc})") from None
    if not isinstance(body, dict):
        raise ValueError(f"{MIG_PARTED_KEY}: expected a mapping at the top level")
    configs = body.get("mig-configs") or {}
    if not isinstance(configs, dict):
        raise ValueError("mig-configs: expected a mapping of config name to entries")
    return {str(name): _entries(str(name), entries) for name, entries in configs.items()}


def _entries(name: str, entries: Any) -> tuple[DeviceEntry, ...]:
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"mig-configs.{name}: expected a non-empty list of device entries")
    return tuple(_entry(f"mig-configs.{name}[{i}]", entry) for i, entry in enumerate(entries))


def _entry(where: str, entry: Any) -> DeviceEntry:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a mapping")
    devices = entry.get("devices")
    if devices == "all":
        indexes: tuple[int, ...] | None = None
    elif isinstance(devices, list) and devices and all(isinstance(d, int) and d >= 0 for d in devices):
        indexes = tuple(devices)
    else:
        raise ValueError(f"{where}.devices: expected `all` or a list of GPU indexes, got {devices!r}")
    enabled = entry.get("mig-enabled")
    if not isinstance(enabled, bool):
        raise ValueError(f"{where}.mig-enabled: expected true or false, got {enabled!r}")
    counts = entry.get("mig-devices") or {}
    if not isinstance(counts, dict) or not all(
        isinstance(count, int) and count >= 1 for count in counts.values()
    ):
        raise ValueError(f"{where}.mig-devices: expected profile -> a count >= 1, got {counts!r}")
    if counts and not enabled:
        raise ValueError(f"{where}.mig-devices: given with mig-enabled false")
    return DeviceEntry(indexes, enabled, tuple(sorted((str(k), int(v)) for k, v in counts.items())))


def entries_for(configmap_data: dict[str, str] | None, config: str) -> tuple[DeviceEntry, ...] | None:
    """The named config's entries from the ConfigMap's data; None when it is not there (or unreadable:
    the MIG manager then falls back to the operator's built-in configs)."""
    text = (configmap_data or {}).get(MIG_PARTED_KEY)
    if not text:
        return None
    try:
        return parse_mig_parted(text).get(config)
    except ValueError:
        return None


def entry_profiles(
    entries: tuple[DeviceEntry, ...], index: int, model: str
) -> tuple[bool, tuple[str, ...]] | None:
    """(MIG enabled, profiles) for the GPU at `index`, or None when no entry lists it.

    The last entry that lists a GPU wins, as mig-parted applies them in order. A profile the model
    does not have raises ValueError naming the GPU and the model."""
    chosen = None
    for entry in entries:
        if entry.covers(index):
            chosen = entry
    if chosen is None:
        return None
    geometry = catalogue_model(model).mig
    if chosen.mig_enabled and geometry is None:
        raise ValueError(f"GPU {index}: model {model} does not support MIG")
    for profile in chosen.profiles:
        if geometry is not None and not geometry.has_profile(profile):
            raise ValueError(
                f"GPU {index}: model {model} has no MIG profile {profile}; "
                f"it has {', '.join(geometry.profile_names)}"
            )
    return chosen.mig_enabled, chosen.profiles


def listed_devices(entries: tuple[DeviceEntry, ...], gpu_count: int) -> set[int]:
    """GPU indexes the entries name; ValueError for an index the node does not have."""
    listed: set[int] = set()
    for entry in entries:
        if entry.devices is None:
            listed.update(range(gpu_count))
            continue
        for index in entry.devices:
            if index >= gpu_count:
                raise ValueError(f"devices: GPU index {index}, but the node has {gpu_count} GPU(s)")
            listed.add(index)
    return listed
