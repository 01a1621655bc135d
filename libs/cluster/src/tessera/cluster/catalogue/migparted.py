"""The GPU Operator's named MIG configurations (the `default-mig-parted-config` ConfigMap).

Setting the node label ``nvidia.com/mig.config`` to one of these names makes the MIG manager lay out
every GPU of the node that way. ``all-<profile>`` fills each GPU with as many instances of one
profile as it takes, ``all-<profile>.me`` makes the single media-extension instance, and
``all-balanced`` mixes small, medium and large slices, per model, as the operator's default file does.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.cluster.catalogue.models import GpuModel, GpuModelName
from tessera.cluster.catalogue.models import model as catalogue_model

ALL_DISABLED = "all-disabled"
ALL_ENABLED = "all-enabled"
ALL_BALANCED = "all-balanced"


class UnknownMigConfig(KeyError):
    """A mig-parted config name that does not apply to the GPU model."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class MigPartedLayout:
    """What one named config does to each GPU of a given model."""

    config: str
    mig_enabled: bool
    profiles: tuple[str, ...]


# The operator's `all-balanced` entries: two small, one medium and one large slice (A30: 2 + 1).
_BALANCED: dict[str, tuple[str, ...]] = {
    GpuModelName.A100_40GB: ("1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"),
    GpuModelName.A100_80GB: ("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"),
    GpuModelName.H100_80GB: ("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"),
    GpuModelName.H200_141GB: ("1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"),
    GpuModelName.A30: ("1g.6gb", "1g.6gb", "2g.12gb"),
}


def mig_parted_layout(config: str, gpu_model: str | GpuModel) -> MigPartedLayout:
    """The per-GPU layout that the named config gives a GPU of ``gpu_model``.

    Raises UnknownMigConfig when the name is not a known config or does not apply to the model
    (for instance ``all-1g.10gb`` on an A30, or any MIG config on a T4).
    """
    entry = gpu_model if isinstance(gpu_model, GpuModel) else catalogue_model(gpu_model)
    if config == ALL_DISABLED:
        return MigPartedLayout(config, False, ())
    geometry = entry.mig
    if geometry is None:
        raise UnknownMigConfig(f"mig config {config!r}: GPU model {entry.name} does not support MIG")
    if config == ALL_ENABLED:
        return MigPartedLayout(config, True, ())
    if config == ALL_BALANCED:
        return MigPartedLayout(config, True, _BALANCED[entry.name])
    if config.startswith("all-"):
        name = config[len("all-") :]
        if name.endswith(".me"):
            name = name[: -len(".me")] + "+me"
        if geometry.has_profile(name):
            profile = geometry.profile(name)
            return MigPartedLayout(config, True, (profile.name,) * profile.max_instances)
    raise UnknownMigConfig(
        f"mig config {config!r}: not a known config for GPU model {entry.name}; "
        f"known: {', '.join(mig_parted_configs(entry))}"
    )


def mig_parted_configs(gpu_model: str | GpuModel) -> tuple[str, ...]:
    """The config names that apply to a GPU model, in a stable order."""
    entry = gpu_model if isinstance(gpu_model, GpuModel) else catalogue_model(gpu_model)
    if entry.mig is None:
        return (ALL_DISABLED,)
    names = [ALL_DISABLED, ALL_ENABLED]
    for profile in entry.mig.profiles:
        if profile.media_extensions:
            names.append(f"all-{profile.name.removesuffix('+me')}.me")
        else:
            names.append(f"all-{profile.name}")
    names.append(ALL_BALANCED)
    return tuple(names)


def mig_parted_profiles(config: str, gpu_model: str | GpuModel, gpu_count: int) -> list[tuple[str, ...]]:
    """Per-GPU profile lists for a node of ``gpu_count`` GPUs of one model (mig-parted's `devices: all`)."""
    if gpu_count < 0:
        raise ValueError(f"gpu_count: must be >= 0, got {gpu_count}")
    layout = mig_parted_layout(config, gpu_model)
    return [layout.profiles for _ in range(gpu_count)]
