"""Desired GPU layouts, the plan that moves a cluster toward them, and the configs that apply them.

A GPU is shared one of four ways: exclusively (one pod), as MIG instances (a geometry of profiles
at start indexes, valid for its model), time-sliced into N replicas, or under MPS with N clients.
The GPU Operator applies MIG through a named mig-parted config per node (per-device entries are
allowed) and time-slicing or MPS through a device-plugin config per node. The device plugin
shares every whole (non-MIG) GPU of a node alike, so a node's non-MIG GPUs must agree on one
sharing mode and replica count; `device_plugin_config` raises when they do not.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tessera.cluster.catalogue import GpuModel, InvalidMigLayout
from tessera.cluster.conventions.names import GPU_RESOURCE, mig_resource_name
from tessera.cluster.domain.gpu import MigInstance

MIG_CONFIG_PREFIX = "tessera-"

# CUDA MPS under the device plugin needs Volta or newer (compute capability 7.0+).
MPS_ARCHITECTURES = frozenset({"Volta", "Turing", "Ampere", "Ada Lovelace", "Hopper"})


class InvalidLayout(ValueError):
    """A layout that cannot be applied, with the field and the reason in its message."""


class SharingMode(StrEnum):
    EXCLUSIVE = "exclusive"
    MIG = "mig"
    TIME_SLICING = "time-slicing"
    MPS = "mps"


@dataclass(frozen=True, slots=True, order=True)
class MigSlice:
    """One MIG instance of a desired geometry: a profile at a start index on the memory-slice axis."""

    start: int
    profile: str

    def __post_init__(self) -> None:
        if self.start < 0:
            raise InvalidLayout(f"mig slice {self.profile}: start must be >= 0, got {self.start}")
        if not self.profile:
            raise InvalidLayout("mig slice: profile must not be empty")

    def describe(self) -> str:
        return f"{self.profile}@{self.start}"


@dataclass(frozen=True, slots=True)
class GpuLayout:
    """How one GPU is shared. Build it with the class methods; the slices are kept sorted by start."""

    mode: SharingMode
    mig: tuple[MigSlice, ...] = ()
    replicas: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "mig", tuple(sorted(self.mig)))
        if self.mode is not SharingMode.MIG and self.mig:
            raise InvalidLayout(f"layout.mig: only a MIG layout has slices, this one is {self.mode}")
        if self.mode in (SharingMode.EXCLUSIVE, SharingMode.MIG) and self.replicas != 1:
            raise InvalidLayout(f"layout.replicas: must be 1 for {self.mode}, got {self.replicas}")
        if self.mode in (SharingMode.TIME_SLICING, SharingMode.MPS) and self.replicas < 2:
            raise InvalidLayout(f"layout.replicas: {self.mode} needs at least 2, got {self.replicas}")

    @classmethod
    def exclusive(cls) -> GpuLayout:
        return cls(SharingMode.EXCLUSIVE)

    @classmethod
    def mig_geometry(cls, slices: Iterable[MigSlice | tuple[str, int]]) -> GpuLayout:
        """A MIG layout from slices or (profile, start) pairs."""
        resolved = tuple(s if isinstance(s, MigSlice) else MigSlice(start=s[1], profile=s[0]) for s in slices)
        return cls(SharingMode.MIG, mig=resolved)

    @classmethod
    def time_slicing(cls, replicas: int) -> GpuLayout:
        return cls(SharingMode.TIME_SLICING, replicas=replicas)

    @classmethod
    def mps(cls, replicas: int) -> GpuLayout:
        return cls(SharingMode.MPS, replicas=replicas)

    @classmethod
    def parse(cls, text: str) -> GpuLayout:
        """The inverse of `describe`: 'exclusive', 'mig:1g.10gb@0,3g.40gb@4', 'time-slicing:4', 'mps:4'."""
        mode_text, _, rest = text.strip().partition(":")
        try:
            mode = SharingMode(mode_text)
        except ValueError:
            known = ", ".join(m.value for m in SharingMode)
            raise InvalidLayout(f"layout {text!r}: mode must be one of {known}") from None
        if mode is SharingMode.EXCLUSIVE:
            if rest:
                raise InvalidLayout(f"layout {text!r}: exclusive takes no arguments")
            return cls.exclusive()
        if mode is SharingMode.MIG:
            slices: list[MigSlice] = []
            for item in filter(None, rest.split(",")):
                profile, at, start = item.partition("@")
                if not at or not start.isdigit():
                    raise InvalidLayout(f"layout {text!r}: slice {item!r} must read <profile>@<start>")
                slices.append(MigSlice(start=int(start), profile=profile))
            return cls.mig_geometry(slices)
        if not rest.isdigit():
            raise InvalidLayout(f"layout {text!r}: {mode} needs a replica count, as in '{mode}:4'")
        return cls(mode, replicas=int(rest))

    def describe(self) -> str:
        if self.mode is SharingMode.EXCLUSIVE:
            return "exclusive"
        if self.mode is SharingMode.MIG:
            return "mig:" + ",".join(s.describe() for s in self.mig)
        return f"{self.mode}:{self.replicas}"

    def __str__(self) -> str:
        return self.describe()

    @property
    def mig_profiles(self) -> tuple[str, ...]:
        return tuple(s.profile for s in self.mig)

    def mig_profile_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(self.mig_profiles).items()))

    def capacity(self) -> dict[str, int]:
        """The extended resources this GPU advertises under the device plugin's mixed MIG strategy."""
        if self.mode is SharingMode.MIG:
            return {mig_resource_name(p): n for p, n in self.mig_profile_counts().items()}
        return {GPU_RESOURCE: self.replicas}

    def validate_for(self, model: GpuModel) -> None:
        """Raise InvalidLayout, naming the reason, unless a GPU of ``model`` can take this layout."""
        if self.mode is SharingMode.MIG:
            if model.mig is None:
                raise InvalidLayout(f"layout {self}: GPU model {model.name} does not support MIG")
            try:
                model.mig.validate(MigInstance(s.profile, s.start) for s in self.mig)
            except InvalidMigLayout as exc:
                raise InvalidLayout(f"layout {self} on {model.name}: {exc}") from None
        if self.mode is SharingMode.MPS and model.architecture not in MPS_ARCHITECTURES:
            raise InvalidLayout(
                f"layout {self}: MPS needs Volta or newer, GPU model {model.name} is {model.architecture}"
            )


@dataclass(frozen=True, slots=True)
class PlanScore:
    """What a change gains and what it costs.

    Benefit: pending pods that become placeable, and GPUs freed (whole GPUs no longer needed by the
    pods they hold). Cost: running pods disturbed (always 0 for a plan the planner emits, since it
    never takes a held slice), and GPU-minutes of capacity lost while the GPUs are reconfigured.
    """

    pods_placeable: int = 0
    gpus_freed: float = 0.0
    pods_disturbed: int = 0
    capacity_minutes_lost: float = 0.0

    def __add__(self, other: PlanScore) -> PlanScore:
        return PlanScore(
            self.pods_placeable + other.pods_placeable,
            self.gpus_freed + other.gpus_freed,
            self.pods_disturbed + other.pods_disturbed,
            self.capacity_minutes_lost + other.capacity_minutes_lost,
        )


@dataclass(frozen=True, slots=True)
class GpuChange:
    """One GPU's move from its current layout to its desired one, and why."""

    node: str
    gpu_index: int
    model: str
    current: GpuLayout
    desired: GpuLayout
    reason: str
    score: PlanScore = PlanScore()

    @property
    def changed(self) -> bool:
        return self.current != self.desired


@dataclass(frozen=True, slots=True)
class LayoutPlan:
    """Desired layouts per node and GPU index, with the reasons and the totals of benefit and cost.

    ``explanations`` carry demand the plan cannot serve, such as a MIG profile no GPU model in the
    cluster supports (naming the profile and the models), so that it is reported once, not retried.
    """

    changes: tuple[GpuChange, ...] = ()
    explanations: tuple[str, ...] = ()
    score: PlanScore = field(default_factory=PlanScore)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({c.node for c in self.changes}))

    @property
    def is_empty(self) -> bool:
        return not any(c.changed for c in self.changes)

    def for_node(self, node: str) -> tuple[GpuChange, ...]:
        return tuple(sorted((c for c in self.changes if c.node == node), key=lambda c: c.gpu_index))

    def desired_layouts(self, node: str) -> dict[int, GpuLayout]:
        return {c.gpu_index: c.desired for c in self.for_node(node)}


def mig_parted_entries(layouts: Mapping[int, GpuLayout]) -> list[dict[str, Any]]:
    """The per-device entries of one mig-parted config for a node's GPUs (index -> layout).

    GPUs with the same layout share one entry. A non-MIG GPU gets ``mig-enabled: false``.
    """
    groups: dict[tuple[bool, tuple[tuple[str, int], ...]], list[int]] = {}
    for index, layout in sorted(layouts.items()):
        if index < 0:
            raise InvalidLayout(f"gpu index: must be >= 0, got {index}")
        key = (layout.mode is SharingMode.MIG, tuple(layout.mig_profile_counts().items()))
        groups.setdefault(key, []).append(index)
    entries: list[dict[str, Any]] = []
    for (enabled, counts), devices in sorted(groups.items(), key=lambda item: item[1][0]):
        entry: dict[str, Any] = {"devices": devices, "mig-enabled": enabled}
        if enabled:
            entry["mig-devices"] = dict(counts)
        entries.append(entry)
    return entries


def mig_config_name(layouts: Mapping[int, GpuLayout]) -> str:
    """A stable name for a node's config, short enough for a label value: the same layouts, the same name."""
    text = ";".join(f"{i}={layouts[i].describe()}" for i in sorted(layouts))
    return MIG_CONFIG_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:12]


def mig_parted_config(layouts: Mapping[int, GpuLayout], name: str | None = None) -> dict[str, Any]:
    """A mig-parted document holding one named config for the node: ``{version, mig-configs: {name: [...]}}``."""
    return {"version": "v1", "mig-configs": {name or mig_config_name(layouts): mig_parted_entries(layouts)}}


def device_plugin_config(layouts: Mapping[int, GpuLayout]) -> dict[str, Any]:
    """The device-plugin sharing config for a node: time-slicing or MPS of ``nvidia.com/gpu``, or none.

    Raises InvalidLayout when the node's non-MIG GPUs disagree (the plugin shares them all alike),
    or when MPS would be combined with MIG on the node.
    """
    whole = {i: layout for i, layout in sorted(layouts.items()) if layout.mode is not SharingMode.MIG}
    has_mig = len(whole) < len(layouts)
    kinds = {(layout.mode, layout.replicas) for layout in whole.values()}
    if len(kinds) > 1:
        described = ", ".join(f"gpu {i}: {layout}" for i, layout in whole.items())
        raise InvalidLayout(
            f"device-plugin config: the non-MIG GPUs of a node are shared alike, got {described}"
        )
    body: dict[str, Any] = {"version": "v1"}
    if not kinds:
        return body
    mode, replicas = kinds.pop()
    resources = [{"name": GPU_RESOURCE, "replicas": replicas}]
    if mode is SharingMode.TIME_SLICING:
        body["sharing"] = {"timeSlicing": {"renameByDefault": False, "resources": resources}}
    elif mode is SharingMode.MPS:
        if has_mig:
            raise InvalidLayout("device-plugin config: MPS cannot be combined with MIG on one node")
        body["sharing"] = {"mps": {"renameByDefault": False, "resources": resources}}
    return body


def node_capacity(layouts: Mapping[int, GpuLayout]) -> dict[str, int]:
    """The extended resources a node advertises once its GPUs have these layouts."""
    total: Counter[str] = Counter()
    for layout in layouts.values():
        total.update(layout.capacity())
    return dict(sorted(total.items()))
