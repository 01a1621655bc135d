"""A pod group's Kubernetes `PodTemplateSpec`: what its pods need, read from the template, and the
template with the job spec's shorthand (`cpu`, `memory`, `gpu`) written into it. Pure.

The shorthand fills the first container, as a user writing the pod by hand would: `gpu.count` is the
limit `nvidia.com/gpu`, `gpu.mig_profile` the limit `nvidia.com/mig-<profile>`, and `gpu.milli` a
whole `nvidia.com/gpu` shared through the `tessera.io/gpu-milli` annotation (the cluster convention
the scheduler and the devcluster read). A pod needs what its containers request, summed; a container
that states only a limit requests that limit, as the API server defaults it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tessera.contracts.quantities import parse_cpu_milli, parse_memory_mib

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
GPU_MILLI_ANNOTATION = "tessera.io/gpu-milli"


@dataclass(frozen=True)
class TemplateGpu:
    """The GPUs one pod of a template asks for; exactly one field is set."""

    count: int | None = None
    milli: int | None = None
    mig_profile: str | None = None

    def __str__(self) -> str:
        if self.count is not None:
            return f"{self.count} whole GPU(s)"
        if self.milli is not None:
            return f"{self.milli} milli-GPU"
        return f"one MIG slice {self.mig_profile}"

    def as_request(self) -> dict[str, int | str]:
        found = {"count": self.count, "milli": self.milli, "mig_profile": self.mig_profile}
        return {key: value for key, value in found.items() if value is not None}


@dataclass(frozen=True)
class TemplateNeeds:
    """What a template's containers request, per pod: None where no container says."""

    cpu_milli: int | None
    memory_mib: int | None
    gpu: TemplateGpu | None


def _containers(template: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = template.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    if not isinstance(containers, list):
        return []
    return [c for c in containers if isinstance(c, Mapping)]


def _amounts(container: Mapping[str, Any]) -> dict[str, Any]:
    """A container's requests, with its limits standing in for requests it leaves out."""
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        return {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    merged: dict[str, Any] = dict(limits) if isinstance(limits, Mapping) else {}
    if isinstance(requests, Mapping):
        merged.update(requests)
    return merged


def _whole(value: Any, what: str) -> int:
    text = str(value).strip()
    if not text.isdigit():
        raise ValueError(f"{what} must be a whole number, got {value!r}")
    return int(text)


def template_needs(template: Mapping[str, Any]) -> TemplateNeeds:
    """What one pod of ``template`` requests; raises ValueError naming a quantity it cannot read."""
    cpu: int | None = None
    memory: int | None = None
    gpus = 0
    mig: dict[str, int] = {}
    for container in _containers(template):
        amounts = _amounts(container)
        if "cpu" in amounts:
            cpu = (cpu or 0) + parse_cpu_milli(amounts["cpu"])
        if "memory" in amounts:
            memory = (memory or 0) + parse_memory_mib(amounts["memory"])
        if GPU_RESOURCE in amounts:
            gpus += _whole(amounts[GPU_RESOURCE], GPU_RESOURCE)
        for name, value in amounts.items():
            if str(name).startswith(MIG_RESOURCE_PREFIX):
                profile = str(name)[len(MIG_RESOURCE_PREFIX) :].replace(".me", "+me")
                mig[profile] = mig.get(profile, 0) + _whole(value, str(name))
    return TemplateNeeds(cpu, memory, _gpu_of(template, gpus, mig))


def _gpu_of(template: Mapping[str, Any], gpus: int, mig: Mapping[str, int]) -> TemplateGpu | None:
    metadata = template.get("metadata") or {}
    annotations = metadata.get("annotations") or {} if isinstance(metadata, Mapping) else {}
    milli = annotations.get(GPU_MILLI_ANNOTATION) if isinstance(annotations, Mapping) else None
    wanted = [profile for profile, count in mig.items() if count]
    if (gpus and wanted) or len(wanted) > 1 or any(count > 1 for count in mig.values()):
        raise ValueError("a pod takes whole GPUs or one MIG slice, not both nor several slices")
    if wanted:
        return TemplateGpu(mig_profile=wanted[0])
    if milli is not None:
        if gpus != 1:
            raise ValueError(f"the {GPU_MILLI_ANNOTATION} annotation shares one {GPU_RESOURCE}; got {gpus}")
        return TemplateGpu(milli=_whole(milli, GPU_MILLI_ANNOTATION))
    return TemplateGpu(count=gpus) if gpus else None


def render_pod_template(
    template: Mapping[str, Any],
    *,
    cpu_milli: int,
    memory_mib: int,
    gpu: TemplateGpu | None,
    gpu_models: list[str] | None = None,
) -> dict[str, Any]:
    """``template`` with the shorthand written into its first container where the template leaves
    a resource out (a copy; the template is left as it is)."""
    rendered: dict[str, Any] = copy.deepcopy(dict(template))
    metadata = rendered.setdefault("metadata", {})
    annotations: dict[str, str] = metadata.setdefault("annotations", {})
    containers = rendered.setdefault("spec", {}).setdefault("containers", [])
    if not containers:
        return rendered
    resources = containers[0].setdefault("resources", {})
    requests: dict[str, str] = resources.setdefault("requests", {})
    limits: dict[str, str] = resources.setdefault("limits", {})
    needs = template_needs(template)
    if needs.cpu_milli is None:
        requests["cpu"] = f"{cpu_milli}m"
    if needs.memory_mib is None:
        requests["memory"] = f"{memory_mib}Mi"
    if gpu is not None and needs.gpu is None:
        if gpu.count is not None:
            limits[GPU_RESOURCE] = str(gpu.count)
        elif gpu.milli is not None:
            limits[GPU_RESOURCE] = "1"
            annotations[GPU_MILLI_ANNOTATION] = str(gpu.milli)
        elif gpu.mig_profile is not None:
            limits[MIG_RESOURCE_PREFIX + gpu.mig_profile.replace("+", ".")] = "1"
    if gpu_models:
        annotations.setdefault("tessera.io/gpu-models", "|".join(gpu_models))
    return rendered
