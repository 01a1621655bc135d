"""The job spec: what users submit. Shaped after the pods and PodGroups they already write."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tessera.contracts.quantities import parse_cpu_milli, parse_memory_mib

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MIG_PROFILE = re.compile(r"^[1-7]g\.\d+gb(\+me)?$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class TopologyPreference(StrEnum):
    """How tightly the pods of a job want to sit together."""

    NONE = "none"
    SAME_NODE = "same-node"
    NVLINK = "nvlink"
    SAME_RACK = "same-rack"


class PlacementPolicy(StrEnum):
    BINPACK = "binpack"
    SPREAD = "spread"


class GpuRequest(_Strict):
    """GPUs per pod: a whole count, a fraction in milli-GPU, or one MIG slice."""

    count: Annotated[int | None, Field(ge=1, le=16, description="whole GPUs per pod")] = None
    milli: Annotated[int | None, Field(ge=1, le=999, description="a fraction of one GPU, in thousandths")] = (
        None
    )
    mig_profile: Annotated[
        str | None, Field(description="a MIG profile such as 1g.10gb or 3g.40gb", examples=["1g.10gb"])
    ] = None
    models: Annotated[
        list[str], Field(description="allowed GPU models; empty means any", examples=[["A100-80GB"]])
    ] = []

    @field_validator("mig_profile")
    @classmethod
    def _mig_profile_shape(cls, value: str | None) -> str | None:
        if value is not None and not MIG_PROFILE.match(value):
            raise ValueError(f"{value!r} is not a MIG profile such as '1g.10gb' or '3g.40gb'")
        return value

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> Self:
        kinds = [k for k in ("count", "milli", "mig_profile") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("give exactly one of count, milli or mig_profile")
        return self

    @property
    def milli_per_pod(self) -> int:
        """Milli-GPU one pod takes; a MIG slice counts as its share of seven slices."""
        if self.count is not None:
            return self.count * 1000
        if self.milli is not None:
            return self.milli
        assert self.mig_profile is not None
        return int(self.mig_profile.split("g.", 1)[0]) * 1000 // 7


class PodGroupSpec(_Strict):
    """A set of identical pods, placed all-or-nothing down to `min_available`."""

    name: Annotated[str, Field(pattern=DNS_LABEL, max_length=40)]
    replicas: Annotated[int, Field(ge=1, le=1024)]
    min_available: Annotated[int | None, Field(ge=1, description="defaults to replicas")] = None
    cpu: Annotated[str | int | float, Field(description="per pod, e.g. '4' or '500m'")] = "1"
    memory: Annotated[str | int, Field(description="per pod, e.g. '16Gi'")] = "1Gi"
    gpu: GpuRequest | None = None

    @field_validator("cpu")
    @classmethod
    def _cpu_quantity(cls, value: str | int | float) -> str | int | float:
        parse_cpu_milli(value)
        return value

    @field_validator("memory")
    @classmethod
    def _memory_quantity(cls, value: str | int) -> str | int:
        parse_memory_mib(value)
        return value

    @model_validator(mode="after")
    def _min_available_within_replicas(self) -> Self:
        if self.min_available is not None and self.min_available > self.replicas:
            raise ValueError(f"min_available ({self.min_available}) exceeds replicas ({self.replicas})")
        return self

    @property
    def quorum(self) -> int:
        return self.min_available if self.min_available is not None else self.replicas

    @property
    def cpu_milli(self) -> int:
        return parse_cpu_milli(self.cpu)

    @property
    def memory_mib(self) -> int:
        return parse_memory_mib(self.memory)


class JobSpec(_Strict):
    """A job as a user submits it."""

    name: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]
    tenant: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]
    queue: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)] = "default"
    priority: Annotated[int, Field(ge=-1_000_000, le=1_000_000_000)] = 0
    pod_groups: Annotated[list[PodGroupSpec], Field(min_length=1, max_length=32)]
    topology: TopologyPreference = TopologyPreference.NONE
    placement: PlacementPolicy | None = None
    preemptible: bool = True
    checkpointable: bool = False
    estimated_duration_s: Annotated[int | None, Field(ge=1, le=90 * 24 * 3600)] = None
    labels: dict[str, str] = {}
    priority_class: Annotated[
        str | None,
        Field(
            pattern=DNS_LABEL, max_length=63, description="a priority class; its value replaces `priority`"
        ),
    ] = None

    @model_validator(mode="after")
    def _unique_group_names(self) -> Self:
        names = [g.name for g in self.pod_groups]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"pod group names must be unique; repeated: {', '.join(duplicates)}")
        return self

    @property
    def total_gpu_milli(self) -> int:
        return sum(g.replicas * g.gpu.milli_per_pod for g in self.pod_groups if g.gpu is not None)
