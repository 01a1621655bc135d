"""Every valid MIG geometry of a GPU model, from the catalogue's profiles and placements.

A geometry is a set of (profile, start) slices. Walking the memory slices left to right, each
slice is either left free or starts an instance of a profile whose placements include it and whose
span is free; the catalogue's counting rules (instances per profile, compute slices, one media
extension) prune the walk. Every set comes out once. An A100 or H100 has a few hundred, so the
exact single-GPU planner can score them all.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from tessera.cluster.catalogue import GpuModel, MigGeometry, MigProfile
from tessera.slicing.domain.layout import GpuLayout, MigSlice


@dataclass(frozen=True, slots=True)
class Geometry:
    """One valid MIG geometry with the totals the planner scores it by."""

    slices: tuple[MigSlice, ...]
    counts: tuple[tuple[str, int], ...]
    compute_slices: int
    memory_slices: int

    @property
    def layout(self) -> GpuLayout:
        return GpuLayout.mig_geometry(self.slices)

    def count(self, profile: str) -> int:
        for name, n in self.counts:
            if name == profile:
                return n
        return 0

    def contains(self, held: frozenset[MigSlice]) -> bool:
        return held.issubset(self.slices)


def enumerate_geometries(model: GpuModel) -> tuple[Geometry, ...]:
    """All valid geometries of ``model`` (the empty one included); () when it has no MIG."""
    if model.mig is None:
        return ()
    return _enumerate(model.mig)


@lru_cache(maxsize=32)
def _enumerate(mig: MigGeometry) -> tuple[Geometry, ...]:
    starting_at: list[list[MigProfile]] = [[] for _ in range(mig.memory_slices)]
    for profile in mig.profiles:
        for start in profile.placements:
            starting_at[start].append(profile)
    found: list[Geometry] = []
    chosen: list[tuple[MigProfile, int]] = []
    counts: Counter[str] = Counter()

    def walk(slot: int, compute: int, media: int) -> None:
        if slot >= mig.memory_slices:
            found.append(_geometry(chosen))
            return
        walk(slot + 1, compute, media)  # leave this memory slice free
        for profile in starting_at[slot]:
            if compute + profile.compute_slices > mig.compute_slices:
                continue
            if counts[profile.name] >= profile.max_instances:
                continue
            if media + profile.media_extensions > 1:
                continue
            chosen.append((profile, slot))
            counts[profile.name] += 1
            walk(
                slot + profile.memory_slices,
                compute + profile.compute_slices,
                media + profile.media_extensions,
            )
            counts[profile.name] -= 1
            chosen.pop()

    walk(0, 0, 0)
    return tuple(sorted(found, key=lambda g: (g.compute_slices, g.memory_slices, g.slices)))


def geometries_by_counts(
    model: GpuModel,
) -> tuple[tuple[tuple[tuple[str, int], ...], tuple[Geometry, ...]], ...]:
    """The valid geometries grouped by their instance counts (a few hundred groups at most)."""
    if model.mig is None:
        return ()
    return _by_counts(model.mig)


@lru_cache(maxsize=32)
def _by_counts(mig: MigGeometry) -> tuple[tuple[tuple[tuple[str, int], ...], tuple[Geometry, ...]], ...]:
    groups: dict[tuple[tuple[str, int], ...], list[Geometry]] = {}
    for geometry in _enumerate(mig):
        groups.setdefault(geometry.counts, []).append(geometry)
    return tuple((counts, tuple(members)) for counts, members in groups.items())


def _geometry(chosen: list[tuple[MigProfile, int]]) -> Geometry:
    slices = tuple(sorted(MigSlice(start=start, profile=p.name) for p, start in chosen))
    return Geometry(
        slices=slices,
        counts=tuple(sorted(Counter(p.name for p, _ in chosen).items())),
        compute_slices=sum(p.compute_slices for p, _ in chosen),
        memory_slices=sum(p.memory_slices for p, _ in chosen),
    )


def maximal_geometries(model: GpuModel) -> tuple[Geometry, ...]:
    """Geometries to which no further instance can be added."""
    everything = enumerate_geometries(model)
    keys = {frozenset(g.slices) for g in everything}
    result = []
    for geometry in everything:
        own = frozenset(geometry.slices)
        if not any(own < other for other in keys):
            result.append(geometry)
    return tuple(result)


def supporting_models(profile: str, models: list[GpuModel]) -> list[str]:
    """Names of the given models that offer a MIG profile."""
    return sorted({m.name for m in models if m.mig is not None and m.mig.has_profile(profile)})
