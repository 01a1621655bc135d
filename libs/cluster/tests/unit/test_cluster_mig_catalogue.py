"""The MIG catalogue against NVIDIA's published "Supported MIG Profiles" tables and placements."""

from __future__ import annotations

import pytest

from tessera.cluster.catalogue import (
    A30_MIG,
    A100_40GB_MIG,
    A100_80GB_MIG,
    CATALOGUE,
    H100_80GB_MIG,
    H200_141GB_MIG,
    InvalidMigLayout,
    MigGeometry,
    parse_profile_name,
)
from tessera.cluster.domain import MigInstance

# (geometry, profile, compute slices, memory slices, max instances, placements) per the MIG user guide
# tables and `nvidia-smi mig -lgipp`.
PUBLISHED = [
    (A100_80GB_MIG, "1g.10gb", 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    (A100_80GB_MIG, "1g.10gb+me", 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    (A100_80GB_MIG, "1g.20gb", 1, 2, 4, (0, 2, 4, 6)),
    (A100_80GB_MIG, "2g.20gb", 2, 2, 3, (0, 2, 4)),
    (A100_80GB_MIG, "3g.40gb", 3, 4, 2, (0, 4)),
    (A100_80GB_MIG, "4g.40gb", 4, 4, 1, (0,)),
    (A100_80GB_MIG, "7g.80gb", 7, 8, 1, (0,)),
    (A100_40GB_MIG, "1g.5gb", 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    (A100_40GB_MIG, "1g.10gb", 1, 2, 4, (0, 2, 4, 6)),
    (A100_40GB_MIG, "2g.10gb", 2, 2, 3, (0, 2, 4)),
    (A100_40GB_MIG, "3g.20gb", 3, 4, 2, (0, 4)),
    (A100_40GB_MIG, "4g.20gb", 4, 4, 1, (0,)),
    (A100_40GB_MIG, "7g.40gb", 7, 8, 1, (0,)),
    (H100_80GB_MIG, "1g.10gb", 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    (H100_80GB_MIG, "7g.80gb", 7, 8, 1, (0,)),
    (H200_141GB_MIG, "1g.18gb", 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    (H200_141GB_MIG, "1g.35gb", 1, 2, 4, (0, 2, 4, 6)),
    (H200_141GB_MIG, "2g.35gb", 2, 2, 3, (0, 2, 4)),
    (H200_141GB_MIG, "3g.71gb", 3, 4, 2, (0, 4)),
    (H200_141GB_MIG, "4g.71gb", 4, 4, 1, (0,)),
    (H200_141GB_MIG, "7g.141gb", 7, 8, 1, (0,)),
    (A30_MIG, "1g.6gb", 1, 1, 4, (0, 1, 2, 3)),
    (A30_MIG, "1g.6gb+me", 1, 1, 1, (0, 1, 2, 3)),
    (A30_MIG, "2g.12gb", 2, 2, 2, (0, 2)),
    (A30_MIG, "2g.12gb+me", 2, 2, 1, (0, 2)),
    (A30_MIG, "4g.24gb", 4, 4, 1, (0,)),
]


@pytest.mark.parametrize(("geometry", "name", "compute", "memory", "max_instances", "placements"), PUBLISHED)
def test_profile_matches_published_table(
    geometry: MigGeometry,
    name: str,
    compute: int,
    memory: int,
    max_instances: int,
    placements: tuple[int, ...],
) -> None:
    profile = geometry.profile(name)
    assert (profile.compute_slices, profile.memory_slices, profile.max_instances, profile.placements) == (
        compute,
        memory,
        max_instances,
        placements,
    )


@pytest.mark.parametrize(("geometry", "name", "compute", "memory", "max_instances", "placements"), PUBLISHED)
def test_max_instances_fit_and_one_more_does_not(
    geometry: MigGeometry,
    name: str,
    compute: int,
    memory: int,
    max_instances: int,
    placements: tuple[int, ...],
) -> None:
    layout = geometry.place([name] * max_instances)
    geometry.validate(layout)
    assert len(layout) == max_instances
    with pytest.raises(InvalidMigLayout, match=name.replace("+", r"\+")):
        geometry.place([name] * (max_instances + 1))


@pytest.mark.parametrize(
    "layout",
    [
        ["4g.40gb", "3g.40gb"],
        ["3g.40gb", "3g.40gb"],
        ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
        ["4g.40gb", "2g.20gb", "1g.10gb"],
        ["4g.40gb", "1g.10gb", "1g.10gb", "1g.10gb"],
        ["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"],
        ["2g.20gb", "2g.20gb", "2g.20gb", "1g.20gb"],
        ["2g.20gb", "2g.20gb", "3g.40gb"],
        ["1g.20gb", "1g.20gb", "1g.20gb", "1g.20gb"],
        ["3g.40gb", "1g.20gb", "1g.20gb"],
        ["1g.10gb+me", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"],
        ["2g.20gb", "1g.10gb", "1g.10gb", "3g.40gb"],
    ],
)
def test_valid_mixed_a100_80gb_layouts_are_placed(layout: list[str]) -> None:
    placed = A100_80GB_MIG.place(layout)
    assert sorted(i.profile for i in placed) == sorted(layout)
    assert A100_80GB_MIG.is_valid(placed)


@pytest.mark.parametrize(
    ("layout", "reason"),
    [
        (["7g.80gb", "1g.10gb"], "compute slices"),
        (["4g.40gb", "4g.40gb"], "at most 1"),
        (["4g.40gb", "3g.40gb", "1g.10gb"], "compute slices"),
        (["3g.40gb", "3g.40gb", "1g.10gb"], "no valid placement"),
        (["1g.20gb", "1g.20gb", "1g.20gb", "3g.40gb"], "no valid placement"),
        (["1g.10gb+me", "1g.10gb+me"], "at most 1"),
        (["1g.5gb"], "not supported"),
    ],
)
def test_invalid_a100_80gb_layouts_are_rejected(layout: list[str], reason: str) -> None:
    with pytest.raises(InvalidMigLayout, match=reason):
        A100_80GB_MIG.place(layout)


@pytest.mark.parametrize(
    ("instances", "reason"),
    [
        ([MigInstance("1g.10gb", 7)], "start must be one of"),
        ([MigInstance("3g.40gb", 2)], "start must be one of"),
        ([MigInstance("4g.40gb", 0), MigInstance("2g.20gb", 2)], "memory slice 2 is already taken"),
        ([MigInstance("3g.40gb", 4), MigInstance("1g.20gb", 6)], "memory slice 6 is already taken"),
    ],
)
def test_placed_instances_are_validated_on_the_memory_axis(instances: list[MigInstance], reason: str) -> None:
    with pytest.raises(InvalidMigLayout, match=reason):
        A100_80GB_MIG.validate(instances)


def test_a30_allows_one_media_extension_instance_in_all() -> None:
    assert A30_MIG.fits(["2g.12gb+me", "1g.6gb", "1g.6gb"])
    with pytest.raises(InvalidMigLayout, match="media extensions"):
        A30_MIG.place(["2g.12gb+me", "1g.6gb+me"])


def test_free_start_finds_the_room_left_beside_existing_instances() -> None:
    existing = [MigInstance("3g.40gb", 0), MigInstance("2g.20gb", 4)]
    assert A100_80GB_MIG.free_start(existing, "1g.10gb") == 6
    assert A100_80GB_MIG.free_start(existing, "2g.20gb") is None
    assert A100_80GB_MIG.free_start([], "3g.40gb") == 0


def test_models_carry_their_mig_geometry_and_memory() -> None:
    assert CATALOGUE["A100-80GB"].mig is A100_80GB_MIG
    assert CATALOGUE["T4"].mig is None
    assert CATALOGUE["H200-141GB"].memory_mib == 141 * 1024
    assert A100_80GB_MIG.profile("3g.40gb").memory_mib == 40 * 1024


@pytest.mark.parametrize(
    ("name", "expected"),
    [("3g.40gb", (3, 40, False)), ("1g.10gb+me", (1, 10, True)), ("7g.141gb", (7, 141, False))],
)
def test_profile_names_parse(name: str, expected: tuple[int, int, bool]) -> None:
    assert parse_profile_name(name) == expected


def test_bad_profile_name_names_the_form() -> None:
    with pytest.raises(ValueError, match="<n>g"):
        parse_profile_name("3g40gb")
