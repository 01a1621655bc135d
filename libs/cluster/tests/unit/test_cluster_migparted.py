"""Named mig-parted configs as the GPU Operator's default config file defines them."""

from __future__ import annotations

import pytest

from tessera.cluster.catalogue import (
    CATALOGUE,
    UnknownMigConfig,
    mig_parted_configs,
    mig_parted_layout,
    mig_parted_profiles,
)


@pytest.mark.parametrize(
    ("config", "model", "expected"),
    [
        ("all-1g.10gb", "A100-80GB", ("1g.10gb",) * 7),
        ("all-1g.10gb", "A100-40GB", ("1g.10gb",) * 4),
        ("all-1g.5gb", "A100-40GB", ("1g.5gb",) * 7),
        ("all-2g.20gb", "H100-80GB", ("2g.20gb",) * 3),
        ("all-3g.40gb", "A100-80GB", ("3g.40gb",) * 2),
        ("all-7g.80gb", "H100-80GB", ("7g.80gb",)),
        ("all-1g.20gb", "A100-80GB", ("1g.20gb",) * 4),
        ("all-1g.10gb.me", "A100-80GB", ("1g.10gb+me",)),
        ("all-1g.6gb", "A30", ("1g.6gb",) * 4),
        ("all-2g.12gb", "A30", ("2g.12gb",) * 2),
        ("all-4g.24gb", "A30", ("4g.24gb",)),
        ("all-1g.18gb", "H200-141GB", ("1g.18gb",) * 7),
        ("all-balanced", "A100-80GB", ("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb")),
        ("all-balanced", "H100-80GB", ("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb")),
        ("all-balanced", "A100-40GB", ("1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb")),
        ("all-balanced", "H200-141GB", ("1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb")),
        ("all-balanced", "A30", ("1g.6gb", "1g.6gb", "2g.12gb")),
        ("all-enabled", "A30", ()),
    ],
)
def test_named_config_gives_the_operator_layout(config: str, model: str, expected: tuple[str, ...]) -> None:
    layout = mig_parted_layout(config, model)
    assert layout.mig_enabled
    assert layout.profiles == expected


def test_all_disabled_applies_to_every_model() -> None:
    for model in CATALOGUE:
        layout = mig_parted_layout("all-disabled", model)
        assert (layout.mig_enabled, layout.profiles) == (False, ())


def test_every_listed_config_is_a_valid_layout_of_its_model() -> None:
    for name, model in CATALOGUE.items():
        for config in mig_parted_configs(name):
            layout = mig_parted_layout(config, name)
            if layout.profiles:
                assert model.mig is not None
                assert model.mig.fits(layout.profiles), (config, name)


@pytest.mark.parametrize(
    ("config", "model", "reason"),
    [
        ("all-1g.10gb", "A30", "not a known config"),
        ("all-balanced", "T4", "does not support MIG"),
        ("all-3g.40gb", "H200-141GB", "not a known config"),
        ("everything-please", "A100-80GB", "not a known config"),
        ("all-1g.10gb", "G2", "does not support MIG"),
    ],
)
def test_configs_that_do_not_apply_are_refused(config: str, model: str, reason: str) -> None:
    with pytest.raises(UnknownMigConfig, match=reason):
        mig_parted_layout(config, model)


def test_profiles_per_gpu_repeat_for_every_device() -> None:
    per_gpu = mig_parted_profiles("all-balanced", "A100-80GB", 8)
    assert len(per_gpu) == 8
    assert all(p == ("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb") for p in per_gpu)
