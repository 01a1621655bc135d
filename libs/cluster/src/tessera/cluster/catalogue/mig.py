"""MIG profiles, their valid placements, and the validation and packing of MIG layouts.

A MIG-capable GPU has a row of memory slices (8 on A100/H100/H200, 4 on A30) and a number of
compute slices (7, or 4 on A30). A profile takes ``memory_slices`` consecutive memory slices that
must begin at one of its ``placements`` (the start indexes ``nvidia-smi mig -lgipp`` prints, as
published in NVIDIA's MIG user guide), and ``compute_slices`` compute slices. A layout is valid when
its instances' memory ranges do not overlap, each profile stays within its instance limit, no more
than one instance has media extensions, and the compute slices add up to no more than the GPU has.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tessera.cluster.domain.gpu import MigInstance

_PROFILE_NAME = re.compile(r"^(?P<compute>\d+)g\.(?P<memory>\d+)gb(?P<me>\+me)?$")


class InvalidMigLayout(ValueError):
    """A set of MIG instances that cannot coexist on one GPU."""


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str
    profile_id: int
    compute_slices: int
    memory_slices: int
    max_instances: int
    placements: tuple[int, ...]

    @property
    def memory_gb(self) -> int:
        match = _PROFILE_NAME.match(self.name)
        assert match is not None, self.name
        return int(match["memory"])

    @property
    def memory_mib(self) -> int:
        return self.memory_gb * 1024

    @property
    def media_extensions(self) -> bool:
        return self.name.endswith("+me")

    @property
    def resource_suffix(self) -> str:
        """The profile as it appears in a Kubernetes resource name ('+' is not allowed there)."""
        return self.name.replace("+", ".")


@dataclass(frozen=True, slots=True)
class MigGeometry:
    """The MIG capabilities of one GPU model."""

    compute_slices: int
    memory_slices: int
    profiles: tuple[MigProfile, ...]

    def __post_init__(self) -> None:
        for profile in self.profiles:
            for start in profile.placements:
                if start + profile.memory_slices > self.memory_slices:
                    raise ValueError(f"mig profile {profile.name}: placement {start} runs past the GPU")

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(profile.name for profile in self.profiles)

    def profile(self, name: str) -> MigProfile:
        for profile in self.profiles:
            if profile.name == name:
                return profile
        raise KeyError(
            f"mig profile {name!r} is not supported here; supported: {', '.join(self.profile_names)}"
        )

    def has_profile(self, name: str) -> bool:
        return any(profile.name == name for profile in self.profiles)

    def validate(self, instances: Iterable[MigInstance]) -> None:
        """Raise InvalidMigLayout, naming the reason, unless the placed instances can coexist."""
        placed = list(instances)
        used = [False] * self.memory_slices
        counts: Counter[str] = Counter()
        compute = 0
        media = 0
        for instance in placed:
            try:
                profile = self.profile(instance.profile)
            except KeyError as exc:
                raise InvalidMigLayout(str(exc.args[0])) from None
            if instance.start not in profile.placements:
                raise InvalidMigLayout(
                    f"mig instance {profile.name}@{instance.start}: start must be one of {list(profile.placements)}"
                )
            for slot in range(instance.start, instance.start + profile.memory_slices):
                if used[slot]:
                    raise InvalidMigLayout(
                        f"mig instance {profile.name}@{instance.start}: memory slice {slot} is already taken"
                    )
                used[slot] = True
            counts[profile.name] += 1
            if counts[profile.name] > profile.max_instances:
                raise InvalidMigLayout(
                    f"mig profile {profile.name}: at most {profile.max_instances} instance(s) per GPU"
                )
            compute += profile.compute_slices
            media += profile.media_extensions
        if compute > self.compute_slices:
            raise InvalidMigLayout(
                f"mig layout: needs {compute} compute slices, the GPU has {self.compute_slices}"
            )
        if media > 1:
            raise InvalidMigLayout("mig layout: at most one instance per GPU may have media extensions")

    def is_valid(self, instances: Iterable[MigInstance]) -> bool:
        try:
            self.validate(instances)
        except InvalidMigLayout:
            return False
        return True

    def place(self, profiles: Sequence[str]) -> tuple[MigInstance, ...]:
        """Find start indexes for a list of profile names, or raise InvalidMigLayout.

        Larger instances are placed first; the search backtracks, so any layout that has a valid
        placement is found.
        """
        resolved: list[MigProfile] = []
        for name in profiles:
            try:
                resolved.append(self.profile(name))
            except KeyError as exc:
                raise InvalidMigLayout(str(exc.args[0])) from None
        order = sorted(
            range(len(resolved)), key=lambda i: (-resolved[i].memory_slices, -resolved[i].compute_slices, i)
        )
        # Check the counting rules once, with no placement involved.
        self._check_counts(resolved)
        starts: dict[int, int] = {}
        used = [False] * self.memory_slices
        if not self._search(order, 0, resolved, used, starts):
            raise InvalidMigLayout(f"mig layout {list(profiles)}: no valid placement exists")
        return tuple(MigInstance(resolved[i].name, starts[i]) for i in range(len(resolved)))

    def fits(self, profiles: Sequence[str]) -> bool:
        try:
            self.place(profiles)
        except InvalidMigLayout:
            return False
        return True

    def free_start(self, existing: Iterable[MigInstance], profile: str) -> int | None:
        """The first start index where ``profile`` can be added beside ``existing``, or None."""
        current = list(existing)
        candidate = self.profile(profile)
        for start in candidate.placements:
            if self.is_valid([*current, MigInstance(profile, start)]):
                return start
        return None

    def _check_counts(self, resolved: Sequence[MigProfile]) -> None:
        counts = Counter(profile.name for profile in resolved)
        for profile in resolved:
            if counts[profile.name] > profile.max_instances:
                raise InvalidMigLayout(
                    f"mig profile {profile.name}: at most {profile.max_instances} instance(s) per GPU"
                )
        compute = sum(profile.compute_slices for profile in resolved)
        if compute > self.compute_slices:
            raise InvalidMigLayout(
                f"mig layout: needs {compute} compute slices, the GPU has {self.compute_slices}"
            )
        if sum(profile.media_extensions for profile in resolved) > 1:
            raise InvalidMigLayout("mig layout: at most one instance per GPU may have media extensions")

    def _search(
        self,
        order: list[int],
        depth: int,
        resolved: list[MigProfile],
        used: list[bool],
        starts: dict[int, int],
    ) -> bool:
        if depth == len(order):
            return True
        index = order[depth]
        profile = resolved[index]
        for start in profile.placements:
            span = range(start, start + profile.memory_slices)
            if any(used[slot] for slot in span):
                continue
            for slot in span:
                used[slot] = True
            starts[index] = start
            if self._search(order, depth + 1, resolved, used, starts):
                return True
            for slot in span:
                used[slot] = False
        starts.pop(index, None)
        return False


def _geometry_8(gb1: int, gb2: int, gb4: int, gb8: int) -> MigGeometry:
    """The 7-compute/8-memory-slice geometry shared by A100, H100 and H200, named by memory size."""
    return MigGeometry(
        compute_slices=7,
        memory_slices=8,
        profiles=(
            MigProfile(f"1g.{gb1}gb", 19, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
            MigProfile(f"1g.{gb1}gb+me", 20, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
            MigProfile(f"1g.{gb2}gb", 15, 1, 2, 4, (0, 2, 4, 6)),
            MigProfile(f"2g.{gb2}gb", 14, 2, 2, 3, (0, 2, 4)),
            MigProfile(f"3g.{gb4}gb", 9, 3, 4, 2, (0, 4)),
            MigProfile(f"4g.{gb4}gb", 5, 4, 4, 1, (0,)),
            MigProfile(f"7g.{gb8}gb", 0, 7, 8, 1, (0,)),
        ),
    )


# Profile names carry the memory size, so the same geometry reads 1g.5gb … 7g.40gb on A100-40GB and
# 1g.10gb … 7g.80gb on A100-80GB and H100-80GB (MIG user guide, "Supported MIG Profiles").
A100_40GB_MIG = _geometry_8(5, 10, 20, 40)
A100_80GB_MIG = _geometry_8(10, 20, 40, 80)
H100_80GB_MIG = _geometry_8(10, 20, 40, 80)
H200_141GB_MIG = _geometry_8(18, 35, 71, 141)

A30_MIG = MigGeometry(
    compute_slices=4,
    memory_slices=4,
    profiles=(
        MigProfile("1g.6gb", 14, 1, 1, 4, (0, 1, 2, 3)),
        MigProfile("1g.6gb+me", 21, 1, 1, 1, (0, 1, 2, 3)),
        MigProfile("2g.12gb", 5, 2, 2, 2, (0, 2)),
        MigProfile("2g.12gb+me", 6, 2, 2, 1, (0, 2)),
        MigProfile("4g.24gb", 0, 4, 4, 1, (0,)),
    ),
)


def parse_profile_name(name: str) -> tuple[int, int, bool]:
    """(compute slices, memory GB, media extensions) from a name like '3g.40gb' or '1g.10gb+me'."""
    match = _PROFILE_NAME.match(name)
    if match is None:
        raise ValueError(f"mig profile: {name!r} is not of the form '<n>g.<m>gb' or '<n>g.<m>gb+me'")
    return int(match["compute"]), int(match["memory"]), match["me"] is not None
