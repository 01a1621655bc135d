"""The job spec: what users submit. Shaped after the pods and PodGroups they already write."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from tessera.contracts.quantities import parse_cpu_milli, parse_memory_mib
from tessera.contracts.templates import TemplateGpu, render_pod_template, template_needs

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MIG_PROFILE = re.compile(r"^[1-7]g\.\d+gb(\+me)?$")
MAX_LABELS = 64
MAX_LABEL_KEY = 63
MAX_LABEL_VALUE = 256


def check_text(value: Any, path: str = "") -> None:
    """Raise ValueError naming the path of the first string (key or value, at any depth) that
    holds a NUL or a lone surrogate: neither can be stored nor sent as UTF-8."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"{path or 'value'} must not contain a NUL character")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{path or 'value'} must not contain a lone surrogate") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key, f"{path}[{key!r}] key" if path else "key")
            check_text(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_text(item, f"{path}[{i}]")


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

    count: Annotated[StrictInt | None, Field(ge=1, le=16, description="whole GPUs per pod")] = None
    milli: Annotated[
        StrictInt | None, Field(ge=1, le=999, description="a fraction of one GPU, in thousandths")
    ] = None
    mig_profile: Annotated[
        str | None, Field(description="a MIG profile such as 1g.10gb or 3g.40gb", examples=["1g.10gb"])
    ] = None
    models: Annotated[
        list[
            Annotated[StrictStr, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][-A-Za-z0-9._ ]*$")]
        ],
        Field(max_length=16, description="allowed GPU models; empty means any", examples=[["A100-80GB"]]),
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
    """A set of identical pods, placed all-or-nothing down to `min_available`.

    `template` is the pods' Kubernetes PodTemplateSpec (image, command, env, volumes...). `cpu`,
    `memory` and `gpu` are shorthand for its first container's resources: given alone they fill the
    template in; left out, they are read from it. Both given, they must agree."""

    name: Annotated[str, Field(pattern=DNS_LABEL, max_length=40)]
    replicas: Annotated[StrictInt, Field(ge=1, le=1024)]
    min_available: Annotated[StrictInt | None, Field(ge=1, description="defaults to replicas")] = None
    cpu: Annotated[
        Annotated[StrictStr, Field(max_length=32)] | StrictInt | StrictFloat,
        Field(description="per pod, e.g. '4' or '500m' (at most 1024 CPUs)"),
    ] = "1"
    memory: Annotated[
        Annotated[StrictStr, Field(max_length=32)] | StrictInt,
        Field(description="per pod, e.g. '16Gi' (at most 16Ti)"),
    ] = "1Gi"
    gpu: GpuRequest | None = None
    template: Annotated[
        dict[str, Any] | None,
        Field(
            description="the pods' Kubernetes PodTemplateSpec (metadata, spec); required to run on a cluster",
            examples=[
                {
                    "spec": {
                        "containers": [
                            {"name": "main", "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"}
                        ]
                    }
                }
            ],
        ),
    ] = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand_from_template(cls, data: Any) -> Any:
        """Resources the shorthand leaves out are read from the template."""
        if not isinstance(data, dict) or not isinstance(data.get("template"), dict):
            return data
        try:
            needs = template_needs(data["template"])
        except ValueError:
            return data  # the after-validator names the problem
        filled = dict(data)
        if needs.cpu_milli is not None and "cpu" not in filled:
            filled["cpu"] = f"{needs.cpu_milli}m"
        if needs.memory_mib is not None and "memory" not in filled:
            filled["memory"] = f"{needs.memory_mib}Mi"
        if needs.gpu is not None and filled.get("gpu") is None:
            filled["gpu"] = needs.gpu.as_request()
        return filled

    @model_validator(mode="after")
    def _template_agrees_with_shorthand(self) -> Self:
        if self.template is None:
            return self
        try:
            needs = template_needs(self.template)
        except ValueError as error:
            raise ValueError(f"template: {error}") from None
        if needs.cpu_milli is not None and needs.cpu_milli != self.cpu_milli:
            raise ValueError(f"cpu {self.cpu!r} disagrees with the template's {needs.cpu_milli}m")
        if needs.memory_mib is not None and needs.memory_mib != self.memory_mib:
            raise ValueError(f"memory {self.memory!r} disagrees with the template's {needs.memory_mib}Mi")
        if needs.gpu is not None and needs.gpu != self.gpu_shape:
            raise ValueError(f"gpu {self.gpu_shape} disagrees with the template's {needs.gpu}")
        return self

    @property
    def gpu_shape(self) -> TemplateGpu | None:
        if self.gpu is None:
            return None
        return TemplateGpu(self.gpu.count, self.gpu.milli, self.gpu.mig_profile)

    def pod_template(self) -> dict[str, Any] | None:
        """The template with the shorthand written in (None without a template)."""
        if self.template is None:
            return None
        return render_pod_template(
            self.template,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
            gpu=self.gpu_shape,
            gpu_models=list(self.gpu.models) if self.gpu else None,
        )

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

    @field_validator("template")
    @classmethod
    def _template_text(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        check_text(value)
        return value

    @model_validator(mode="after")
    def _asks_for_something(self) -> Self:
        if self.gpu is None and self.cpu_milli == 0 and self.memory_mib == 0:
            raise ValueError("a pod group must request some cpu, memory or GPU; it asks for none")
        return self

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
    priority: Annotated[StrictInt, Field(ge=-1_000_000, le=1_000_000_000)] = 0
    pod_groups: Annotated[list[PodGroupSpec], Field(min_length=1, max_length=32)]
    topology: TopologyPreference = TopologyPreference.NONE
    placement: PlacementPolicy | None = None
    preemptible: StrictBool = True
    checkpointable: StrictBool = False
    estimated_duration_s: Annotated[StrictInt | None, Field(ge=1, le=90 * 24 * 3600)] = None
    labels: Annotated[
        dict[
            Annotated[StrictStr, Field(min_length=1, max_length=MAX_LABEL_KEY)],
            Annotated[StrictStr, Field(max_length=MAX_LABEL_VALUE)],
        ],
        Field(max_length=MAX_LABELS, description="free-form; no NUL or lone surrogate characters"),
    ] = {}
    priority_class: Annotated[
        str | None,
        Field(
            pattern=DNS_LABEL, max_length=63, description="a priority class; its value replaces `priority`"
        ),
    ] = None

    @field_validator("labels")
    @classmethod
    def _labels_text(cls, value: dict[str, str]) -> dict[str, str]:
        check_text(value)
        return value

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
