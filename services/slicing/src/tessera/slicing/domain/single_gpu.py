"""The exact MIG plan for one GPU: score every valid geometry that keeps the held slices.

The score is lexicographic, best first:
1. compute slices of pending pods served (the share of the GPU put to work);
2. memory slices of pending pods served;
3. pending pods served;
4. slices of the current geometry kept (fewer changes, so no churn between equal answers);
5. fewer instances (no idle slices carved for nobody).

A slice a running pod holds is never removed or moved: only geometries that contain every held
slice are considered, and a held instance serves no pending pod.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from tessera.cluster.catalogue import GpuModel
from tessera.slicing.domain.geometry import Geometry, geometries_by_counts
from tessera.slicing.domain.layout import GpuLayout, InvalidLayout, MigSlice, SharingMode

Score = tuple[int, int, int, int, int]


@dataclass(frozen=True, slots=True)
class SingleGpuPlan:
    geometry: Geometry
    served: dict[str, int]
    score: Score

    @property
    def layout(self) -> GpuLayout:
        return self.geometry.layout

    @property
    def served_compute(self) -> int:
        return self.score[0]


def score_geometry(
    model: GpuModel,
    slices: tuple[MigSlice, ...],
    demand: Mapping[str, int],
    held: frozenset[MigSlice] = frozenset(),
    current: frozenset[MigSlice] = frozenset(),
) -> tuple[Score, dict[str, int]]:
    """The score of one geometry and the pending pods it serves, by profile."""
    assert model.mig is not None
    counts = Counter(s.profile for s in slices)
    held_counts = Counter(s.profile for s in held)
    served: dict[str, int] = {}
    compute = memory = pods = 0
    for profile, count in counts.items():
        wanted = demand.get(profile, 0)
        n = min(count - held_counts[profile], wanted)
        if n > 0:
            served[profile] = n
            entry = model.mig.profile(profile)
            compute += n * entry.compute_slices
            memory += n * entry.memory_slices
            pods += n
    kept = len(current.intersection(slices))
    return (compute, memory, pods, kept, -len(slices)), served


def best_geometry(
    model: GpuModel,
    demand: Mapping[str, int],
    held: frozenset[MigSlice] = frozenset(),
    current: GpuLayout | None = None,
) -> SingleGpuPlan:
    """The best geometry of a GPU of ``model`` for pending pods by MIG profile.

    Raises InvalidLayout when the model has no MIG, a demand count is negative, or the held slices
    are not part of any valid geometry.
    """
    if model.mig is None:
        raise InvalidLayout(f"gpu model {model.name}: does not support MIG")
    for profile, count in demand.items():
        if count < 0:
            raise InvalidLayout(f"demand[{profile}]: must be >= 0, got {count}")
    now = frozenset(current.mig) if current is not None and current.mode is SharingMode.MIG else frozenset()
    relevant = {p: n for p, n in demand.items() if n > 0 and model.mig.has_profile(p)}
    held_counts = Counter(s.profile for s in held)
    now_counts = Counter(s.profile for s in now)
    # The first three criteria depend on the counts alone: rank the count groups, then break the
    # tie on the slices kept among the geometries of the best groups.
    ranked: list[tuple[tuple[int, int, int], tuple[Geometry, ...]]] = []
    for counts, members in geometries_by_counts(model):
        if any(dict(counts).get(p, 0) < n for p, n in held_counts.items()):
            continue
        compute = memory = pods = 0
        for profile, count in counts:
            n = min(count - held_counts[profile], relevant.get(profile, 0))
            if n > 0:
                entry = model.mig.profile(profile)
                compute += n * entry.compute_slices
                memory += n * entry.memory_slices
                pods += n
        ranked.append(((compute, memory, pods), members))
    ranked.sort(key=lambda item: (item[0], -len(item[1][0].slices)), reverse=True)
    best: SingleGpuPlan | None = None
    for primary, members in ranked:
        if best is not None and (primary < best.score[:3] or best.score[3] == len(now)):
            break  # groups come best first: nothing later can beat it
        if best is not None:
            member_counts = dict(members[0].counts)
            bound = sum(min(member_counts.get(p, 0), n) for p, n in now_counts.items())
            if (bound, -len(members[0].slices)) <= best.score[3:]:
                continue  # no member of this group can keep more of the current slices
        for geometry in members:
            if held and not geometry.contains(held):
                continue
            score, served = score_geometry(model, geometry.slices, relevant, held, now)
            if best is None or score > best.score:
                best = SingleGpuPlan(geometry, served, score)
    if best is None:
        described = ", ".join(s.describe() for s in sorted(held))
        raise InvalidLayout(f"held slices [{described}]: no valid {model.name} geometry contains them")
    return best
