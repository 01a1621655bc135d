"""The MIG manager's config file: per-device entries, the last entry naming a GPU wins, unlisted GPUs
are left alone, and malformed entries are refused naming the field."""

from __future__ import annotations

import pytest

from tessera.devcluster.sim.mig_parted import entries_for, entry_profiles, listed_devices, parse_mig_parted

CONFIG = """
version: v1
mig-configs:
  mixed:
    - devices: all
      mig-enabled: false
    - devices: [1, 3]
      mig-enabled: true
      mig-devices: {"3g.40gb": 2}
"""


def test_per_device_entries_and_the_last_one_naming_a_gpu_wins() -> None:
    [(name, entries)] = parse_mig_parted(CONFIG).items()
    assert name == "mixed"
    assert entry_profiles(entries, 0, "A100-80GB") == (False, ())
    assert entry_profiles(entries, 1, "A100-80GB") == (True, ("3g.40gb", "3g.40gb"))
    assert listed_devices(entries, 4) == {0, 1, 2, 3}


def test_a_gpu_no_entry_names_is_left_alone_and_an_absent_config_falls_back() -> None:
    only_one = parse_mig_parted(
        "mig-configs: {one: [{devices: [2], mig-enabled: true, mig-devices: {'7g.80gb': 1}}]}"
    )["one"]
    assert entry_profiles(only_one, 0, "A100-80GB") is None
    assert entries_for({"config.yaml": CONFIG}, "all-1g.10gb") is None  # a built-in name
    assert entries_for(None, "mixed") is None


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("mig-configs: {c: []}", r"mig-configs\.c: expected a non-empty list"),
        ("mig-configs: {c: [{devices: [-1], mig-enabled: true}]}", r"mig-configs\.c\[0\]\.devices"),
        ("mig-configs: {c: [{devices: all, mig-enabled: maybe}]}", r"mig-configs\.c\[0\]\.mig-enabled"),
        (
            "mig-configs: {c: [{devices: all, mig-enabled: false, mig-devices: {'1g.10gb': 7}}]}",
            r"mig-devices: given with mig-enabled false",
        ),
        ("mig-configs: [a, b]", r"mig-configs: expected a mapping"),
    ],
)
def test_malformed_configs_are_refused_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        parse_mig_parted(text)


def test_a_profile_the_model_lacks_and_a_gpu_the_node_lacks_are_named() -> None:
    entries = parse_mig_parted(
        "mig-configs: {c: [{devices: [5], mig-enabled: true, mig-devices: {'1g.12gb': 7}}]}"
    )["c"]
    with pytest.raises(ValueError, match=r"model A100-80GB has no MIG profile 1g\.12gb"):
        entry_profiles(entries, 5, "A100-80GB")
    with pytest.raises(ValueError, match="GPU index 5, but the node has 4"):
        listed_devices(entries, 4)
    with pytest.raises(ValueError, match="does not support MIG"):
        entry_profiles(entries, 5, "T4")
