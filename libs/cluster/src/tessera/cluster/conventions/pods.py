"""Pods and PodGroups from Kubernetes dicts into the domain model, by Tessera's conventions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.cluster.catalogue.models import normalise_model_name
from tessera.cluster.conventions import quantity
from tessera.cluster.conventions.assignment import decode_assignment
from tessera.cluster.conventions.kube_dict import get, string_map
from tessera.cluster.conventions.names import (
    GPU_ASSIGNMENT_ANNOTATION,
    GPU_MILLI_ANNOTATION,
    GPU_MODELS_ANNOTATION,
    GPU_RESOURCE,
    POD_GROUP_LABEL,
    mig_profile_of_resource,
)
from tessera.cluster.domain.affinity import parse_required_affinity
from tessera.cluster.domain.allocation import DeviceAssignment
from tessera.cluster.domain.gpu import MILLI_PER_GPU
from tessera.cluster.domain.node import TaintEffect, Toleration, TolerationOperator
from tessera.cluster.domain.requirements import GpuRequest, Pod, PodGroup, PodPhase, PodRequirements


def parse_pod(obj: Mapping[str, Any]) -> Pod:
    """A pod dict into a Pod.

    Identity problems (no name or namespace) raise ValueError. Problems with what the pod asks for
    do not: the pod comes back with no GPU request and ``problem`` set, so the scheduler can report
    it as unschedulable with the reason instead of losing it.
    """
    metadata = get(obj, "metadata", {})
    spec = get(obj, "spec", {})
    status = get(obj, "status", {})
    name = get(metadata, "name")
    namespace = get(metadata, "namespace", "default")
    if not name:
        raise ValueError("pod.metadata.name: missing")
    labels = string_map(metadata, "labels", "pod.metadata.labels")
    annotations = string_map(metadata, "annotations", "pod.metadata.annotations")
    problem: str | None = None
    try:
        requirements = parse_pod_requirements(spec, annotations)
    except ValueError as exc:
        problem = str(exc)
        requirements = PodRequirements()
    assignment: DeviceAssignment | None = None
    if GPU_ASSIGNMENT_ANNOTATION in annotations:
        try:
            assignment = decode_assignment(annotations[GPU_ASSIGNMENT_ANNOTATION])
        except ValueError as exc:
            problem = problem or str(exc)
    phase_text = get(status, "phase", PodPhase.PENDING.value)
    try:
        phase = PodPhase(phase_text)
    except ValueError:
        phase = PodPhase.UNKNOWN
    return Pod(
        namespace=namespace,
        name=name,
        requirements=requirements,
        uid=get(metadata, "uid", ""),
        scheduler_name=get(spec, "schedulerName", ""),
        node_name=get(spec, "nodeName") or None,
        phase=phase,
        pod_group=labels.get(POD_GROUP_LABEL) or None,
        labels=labels,
        annotations=annotations,
        assignment=assignment,
        resource_version=get(metadata, "resourceVersion"),
        deleting=get(metadata, "deletionTimestamp") is not None,
        problem=problem,
        gated=bool(get(spec, "schedulingGates")),
    )


def parse_pod_requirements(spec: Mapping[str, Any], annotations: Mapping[str, str]) -> PodRequirements:
    """CPU, memory and GPU demand plus placement constraints; ValueError names the bad field."""
    containers = get(spec, "containers", [])
    init_containers = get(spec, "initContainers", [])
    totals: dict[str, int] = {}
    for i, container in enumerate(containers):
        for key, amount in _container_requests(container, f"spec.containers[{i}]").items():
            totals[key] = totals.get(key, 0) + amount
    for i, container in enumerate(init_containers):
        for key, amount in _container_requests(container, f"spec.initContainers[{i}]").items():
            totals[key] = max(totals.get(key, 0), amount)
    for key, value in (get(spec, "overhead", {}) or {}).items():
        totals[key] = totals.get(key, 0) + _amount(key, value, f"spec.overhead[{key}]")
    gpu = _gpu_request(totals, annotations)
    tolerations = tuple(
        _toleration(t, f"spec.tolerations[{i}]") for i, t in enumerate(get(spec, "tolerations", []))
    )
    return PodRequirements(
        cpu_milli=totals.get("cpu", 0),
        memory_mib=totals.get("memory", 0),
        gpu=gpu,
        node_selector=string_map(spec, "nodeSelector", "spec.nodeSelector"),
        tolerations=tolerations,
        priority=int(get(spec, "priority", 0)),
        node_affinity=parse_required_affinity(spec),
    )


def parse_pod_group(obj: Mapping[str, Any]) -> PodGroup:
    metadata = get(obj, "metadata", {})
    spec = get(obj, "spec", {})
    status = get(obj, "status", {})
    name = get(metadata, "name")
    if not name:
        raise ValueError("podgroup.metadata.name: missing")
    min_member = get(spec, "minMember")
    if not isinstance(min_member, int) or isinstance(min_member, bool):
        raise ValueError(f"podgroup.spec.minMember: expected an integer, got {min_member!r}")
    timeout = get(spec, "scheduleTimeoutSeconds")
    return PodGroup(
        namespace=get(metadata, "namespace", "default"),
        name=name,
        min_member=min_member,
        schedule_timeout_seconds=int(timeout) if timeout is not None else None,
        phase=get(status, "phase"),
        uid=get(metadata, "uid", ""),
        resource_version=get(metadata, "resourceVersion"),
    )


def _container_requests(container: Mapping[str, Any], where: str) -> dict[str, int]:
    resources = get(container, "resources", {})
    requests = dict(get(resources, "requests", {}) or {})
    limits = get(resources, "limits", {}) or {}
    for key, value in limits.items():
        requests.setdefault(key, value)  # the API server defaults a missing request to the limit
    return {key: _amount(key, value, f"{where}.resources[{key}]") for key, value in requests.items()}


def _amount(key: str, value: Any, field: str) -> int:
    if key == "cpu":
        return quantity.cpu_milli(value, field)
    if key == "memory":
        return quantity.memory_mib(value, field)
    if key == GPU_RESOURCE or mig_profile_of_resource(key) is not None:
        return quantity.count(value, field)
    return 0


def _gpu_request(totals: Mapping[str, int], annotations: Mapping[str, str]) -> GpuRequest:
    whole = totals.get(GPU_RESOURCE, 0)
    mig = {mig_profile_of_resource(k): v for k, v in totals.items() if mig_profile_of_resource(k) and v > 0}
    models = _allowed_models(annotations)
    milli_text = annotations.get(GPU_MILLI_ANNOTATION)
    if mig:
        if len(mig) > 1:
            raise ValueError(
                f"resources: a pod may ask for one MIG profile, got {sorted(p or '' for p in mig)}"
            )
        if whole or milli_text is not None:
            raise ValueError(
                f"resources: MIG slices cannot be mixed with {GPU_RESOURCE} or {GPU_MILLI_ANNOTATION}"
            )
        ((profile, amount),) = mig.items()
        assert profile is not None
        return GpuRequest.mig(profile, amount)
    if milli_text is not None:
        try:
            milli = int(milli_text)
        except ValueError:
            raise ValueError(f"{GPU_MILLI_ANNOTATION}: expected an integer, got {milli_text!r}") from None
        if not 0 < milli <= MILLI_PER_GPU:
            raise ValueError(f"{GPU_MILLI_ANNOTATION}: must be in 1..1000, got {milli}")
        if whole > 1:
            raise ValueError(
                f"{GPU_MILLI_ANNOTATION}: a GPU share is for one GPU, but {GPU_RESOURCE} is {whole}"
            )
        if milli == MILLI_PER_GPU:
            return GpuRequest.whole(1, models)
        return GpuRequest.fraction(milli, models)
    if whole:
        return GpuRequest.whole(whole, models)
    return GpuRequest.none()


def _allowed_models(annotations: Mapping[str, str]) -> frozenset[str]:
    text = annotations.get(GPU_MODELS_ANNOTATION, "")
    return frozenset(normalise_model_name(part.strip()) for part in text.split("|") if part.strip())


def _toleration(obj: Mapping[str, Any], field: str) -> Toleration:
    operator_text = get(obj, "operator", TolerationOperator.EQUAL.value)
    effect_text = get(obj, "effect")
    try:
        operator = TolerationOperator(operator_text)
    except ValueError:
        raise ValueError(f"{field}.operator: expected Equal or Exists, got {operator_text!r}") from None
    try:
        effect = TaintEffect(effect_text) if effect_text else None
    except ValueError:
        raise ValueError(f"{field}.effect: unknown taint effect {effect_text!r}") from None
    return Toleration(key=get(obj, "key", ""), operator=operator, value=get(obj, "value", ""), effect=effect)
