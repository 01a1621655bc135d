"""Bound pods the scheduler did not place this time, as the cache holds them: pods of other
schedulers and pods of ours someone else bound (held as foreign, no gang member), and pods of ours
bound where our own bind put them (:func:`our_bind`), which stay members of their gang."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import replace

from tessera.cluster.cache import pod_key
from tessera.cluster.conventions.names import SCHEDULER_NAME
from tessera.cluster.domain import GpuRequest, GpuRequestKind, Pod
from tessera.scheduler.domain.cache import CacheConflict, SchedulerCache
from tessera.scheduler.domain.snapshot import Allocation, NodeInfo

FOREIGN = "foreign:"  # gang name prefix of pods other schedulers placed


def foreign_allocation(pod: Pod, uuids: Mapping[int, str]) -> Allocation:
    """What a pod of another scheduler holds: CPU and memory, the GPUs its assignment names, and its
    MIG devices.

    GPUs handed out by the device plugin without Tessera's annotation cannot be told apart, so only
    annotated ones are counted. MIG devices are counted by profile, as the node advertises them:
    the slices its assignment names, else those its request asks for (``nvidia.com/mig-<profile>``)."""
    index_of = {uuid: index for index, uuid in uuids.items()}
    shares = pod.assignment.shares if pod.assignment is not None else ()
    gpus = tuple((index_of[s.gpu_uuid], s.milli) for s in shares if s.gpu_uuid in index_of and s.mig is None)
    mig: dict[str, int] = {}
    for share in shares:
        if share.mig is not None:
            mig[share.mig.profile] = mig.get(share.mig.profile, 0) + 1
    request = pod.requirements.gpu
    if not mig and request.kind is GpuRequestKind.MIG and request.mig_profile and request.count > 0:
        mig[request.mig_profile] = request.count
    key = pod_key(pod)
    return Allocation(
        key,
        f"{FOREIGN}{key}",
        pod.node_name or "",
        gpus,
        pod.requirements.cpu_milli,
        pod.requirements.memory_mib,
        tuple(sorted(mig.items())),
    )


def hold_foreign(cache: SchedulerCache, allocation: Allocation) -> None:
    """Count a pod another scheduler placed as bound; best effort: GPUs or MIG devices the cache
    cannot fit (the node does not advertise them just now, say while its device plugin restarts) are
    left out, but its CPU and memory are still counted; a pod whose CPU and memory do not fit either
    (the node is already full in our books) is left out rather than failing the cycle."""
    try:
        cache.assume(allocation)
    except CacheConflict:
        if not (allocation.gpu_milli or allocation.mig):
            return
        allocation = replace(allocation, gpu_milli=(), mig=())
        try:
            cache.assume(allocation)
        except CacheConflict:
            return
    with contextlib.suppress(CacheConflict):
        cache.confirm_bound(allocation.pod)


def requested_gpus(request: GpuRequest, node: NodeInfo) -> tuple[tuple[int, int], ...]:
    """GPUs of ``node`` that a pod's whole or fractional GPU request takes when no assignment names
    them: idle GPUs for whole ones, else the first GPU the share fits, healthy ones and the lowest
    index first; fewer, or none, where the cache's books show too little free on the node."""
    gpus = sorted((gpu for gpu in node.gpus if not gpu.mig), key=lambda gpu: (not gpu.healthy, gpu.index))
    if request.kind is GpuRequestKind.WHOLE:
        idle = [gpu.index for gpu in gpus if gpu.fully_idle]
        return tuple((index, request.milli) for index in idle[: request.count])
    if request.kind is GpuRequestKind.FRACTIONAL:
        for gpu in gpus:
            if gpu.fits(request.milli):
                return ((gpu.index, request.milli),)
    return ()


def hold_bound_pod(cache: SchedulerCache, pod: Pod, uuids: Mapping[int, str]) -> None:
    """Count a bound pod the scheduler did not place as holding what it uses (:func:`hold_foreign`):
    a pod of another scheduler, or one of ours bound by someone else (by hand, or made with its
    ``nodeName`` set). Such a pod of ours holds the GPUs its assignment names or, with none written,
    GPUs its request takes (:func:`requested_gpus`)."""
    allocation = foreign_allocation(pod, uuids)
    if pod.scheduler_name == SCHEDULER_NAME and pod.assignment is None:
        with contextlib.suppress(KeyError):
            gpus = requested_gpus(pod.requirements.gpu, cache.node(allocation.node))
            allocation = replace(allocation, gpu_milli=gpus)
    hold_foreign(cache, allocation)


def held_by_others(cache: SchedulerCache, key: str) -> bool:
    """Whether the cache holds pod ``key`` as placed by someone else (or, for a pod bound by our
    bind whose gang is gone, in its stead: :meth:`WatchState.let_go`)."""
    allocation = cache.allocation(key)
    return allocation is not None and allocation.gang.startswith(FOREIGN)


def our_bind(pod: Pod) -> bool:
    """Whether a pod of ours is bound where our bind put it: the Binding the scheduler posts writes
    the ``tessera.io/gpu-assignment`` annotation, naming the node and the pod's uid, in the update
    that binds the pod (a bind of this process or of an earlier leader, even one that timed out or
    was rolled back). The uid is what tells our bind from a copy: a user who copies the annotation
    onto a pod they bind by hand copies another pod's uid (the API server gives each pod its own),
    so a uid that differs from the pod's is none of ours. An annotation without a uid is the earlier
    format (a bind of a version before the uid was written, say a leader stopped between its Binding
    and its commit during a rolling upgrade): it is ours when it names the pod's node, as it was
    then, or that pod would be held as someone else's for ever and its gang kept below quorum. The
    mark lives on the pod, so it holds across restarts and leaders."""
    return (
        pod.scheduler_name == SCHEDULER_NAME
        and pod.node_name is not None
        and pod.assignment is not None
        and pod.assignment.node == pod.node_name
        and pod.assignment.pod_uid in (None, pod.uid)
    )


def bound_by_others(cache: SchedulerCache, pod: Pod) -> bool:
    """Whether a pod is no gang member, as one someone else placed: held as such, not bound by us."""
    return held_by_others(cache, pod_key(pod)) and not our_bind(pod)


def adoptable(cache: SchedulerCache, pod: Pod) -> bool:
    """A live pod bound by our bind (:func:`our_bind`) that the cache holds for no gang."""
    key = pod_key(pod)
    return (
        our_bind(pod)
        and not pod.terminated
        and not pod.deleting
        and (cache.allocation(key) is None or held_by_others(cache, key))
    )
