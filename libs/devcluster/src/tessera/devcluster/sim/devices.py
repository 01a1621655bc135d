"""Device allocation, as the device plugin's Allocate hands GPUs to a pod's containers at admission.

A pod that carries Tessera's `tessera.io/gpu-assignment` annotation gets exactly the GPUs (or MIG
instances) named there; any other pod gets devices the way the device plugin picks them: free
whole GPUs for `nvidia.com/gpu`, the fullest GPU that still fits for a `tessera.io/gpu-milli`
share, and a free instance of the profile for `nvidia.com/mig-<profile>`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tessera.cluster.conventions import GPU_ASSIGNMENT_ANNOTATION, decode_assignment, parse_pod_requirements
from tessera.cluster.domain.gpu import MILLI_PER_GPU
from tessera.cluster.domain.requirements import GpuRequestKind
from tessera.devcluster.sim.state import SimGpu


@dataclass(frozen=True)
class Holding:
    """What one pod holds of one GPU: a share in milli-GPUs, or one MIG instance."""

    gpu_uuid: str
    milli: int
    mig_profile: str | None = None
    mig_start: int | None = None
    replica: bool = False  # one time-slicing replica of the GPU


def mig_device_uuid(gpu_uuid: str, start: int) -> str:
    """A stable UUID for the simulated MIG device at `start` on a GPU (NVML names MIG devices `MIG-…`)."""
    return f"MIG-{gpu_uuid.removeprefix('GPU-')}-{start}"


class AdmissionError(Exception):
    """The node cannot give the pod its devices (the kubelet's UnexpectedAdmissionError)."""


def pod_gpu_demand(pod: Mapping[str, Any]) -> Any:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return parse_pod_requirements(pod.get("spec") or {}, annotations).gpu


def uses_gpus(pod: Mapping[str, Any]) -> bool:
    try:
        return bool(pod_gpu_demand(pod).kind is not GpuRequestKind.NONE)
    except ValueError:
        return False


def allocate(
    pod: Mapping[str, Any], gpus: list[SimGpu], held: Iterable[Holding], replicas: int = 1
) -> list[Holding]:
    """The holdings for `pod` on a node whose devices are partly `held` by other pods.

    With time-slicing (`replicas` > 1) each `nvidia.com/gpu` is one replica of a GPU: a GPU serves
    up to `replicas` of them, and the least shared GPUs are handed out first.
    """
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        demand = parse_pod_requirements(pod.get("spec") or {}, annotations).gpu
    except ValueError as exc:
        raise AdmissionError(str(exc)) from None
    held = list(held)
    usable = [g for g in gpus if g.healthy]
    if GPU_ASSIGNMENT_ANNOTATION in annotations:
        return _from_assignment(annotations[GPU_ASSIGNMENT_ANNOTATION], usable)
    match demand.kind:
        case GpuRequestKind.NONE:
            return []
        case GpuRequestKind.WHOLE if replicas > 1:
            slots = [
                (g, replicas - sum(1 for h in held if h.gpu_uuid == g.uuid and h.replica))
                for g in usable
                if not g.mig_enabled
            ]
            free_slots = sum(max(0, n) for _, n in slots)
            if free_slots < demand.count:
                raise AdmissionError(
                    f"Allocate failed: requested {demand.count} nvidia.com/gpu, {free_slots} free replicas"
                )
            picked: list[Holding] = []
            remaining = dict((g.uuid, n) for g, n in slots)
            for _ in range(demand.count):
                uuid = max(remaining, key=lambda u: (remaining[u], -_index(gpus, u)))
                remaining[uuid] -= 1
                picked.append(Holding(uuid, MILLI_PER_GPU // replicas, replica=True))
            return picked
        case GpuRequestKind.WHOLE:
            free = [g for g in usable if not g.mig_enabled and _used_milli(g, held) == 0]
            if len(free) < demand.count:
                raise AdmissionError(
                    f"Allocate failed: requested {demand.count} nvidia.com/gpu, {len(free)} free on the node"
                )
            return [Holding(g.uuid, MILLI_PER_GPU) for g in free[: demand.count]]
        case GpuRequestKind.FRACTIONAL:
            fits = [
                g
                for g in usable
                if not g.mig_enabled and MILLI_PER_GPU - _used_milli(g, held) >= demand.milli
            ]
            if not fits:
                raise AdmissionError(f"Allocate failed: no GPU has {demand.milli} milli-GPU free")
            best = min(fits, key=lambda g: (MILLI_PER_GPU - _used_milli(g, held), g.index))
            return [Holding(best.uuid, demand.milli)]
        case GpuRequestKind.MIG:
            taken = {(h.gpu_uuid, h.mig_start) for h in held if h.mig_profile is not None}
            free_instances = [
                (g, inst)
                for g in usable
                for inst in g.mig_instances
                if inst.profile == demand.mig_profile and (g.uuid, inst.start) not in taken
            ]
            if len(free_instances) < demand.count:
                raise AdmissionError(
                    f"Allocate failed: requested {demand.count} nvidia.com/mig-{demand.mig_profile}, "
                    f"{len(free_instances)} free on the node"
                )
            return [
                Holding(g.uuid, 0, inst.profile, inst.start) for g, inst in free_instances[: demand.count]
            ]
    raise AdmissionError(f"unsupported GPU request {demand}")


def _index(gpus: list[SimGpu], uuid: str) -> int:
    return next(g.index for g in gpus if g.uuid == uuid)


def _used_milli(gpu: SimGpu, held: list[Holding]) -> int:
    return sum(h.milli for h in held if h.gpu_uuid == gpu.uuid and h.mig_profile is None)


def _from_assignment(text: str, gpus: list[SimGpu]) -> list[Holding]:
    try:
        assignment = decode_assignment(text)
    except ValueError as exc:
        raise AdmissionError(str(exc)) from None
    known = {g.uuid for g in gpus}
    holdings = []
    for share in assignment.shares:
        if share.gpu_uuid not in known:
            raise AdmissionError(
                f"{GPU_ASSIGNMENT_ANNOTATION}: GPU {share.gpu_uuid} is not a healthy GPU of the node"
            )
        if share.mig is not None:
            holdings.append(Holding(share.gpu_uuid, 0, share.mig.profile, share.mig.start))
        else:
            holdings.append(Holding(share.gpu_uuid, share.milli))
    return holdings
