"""Cluster watch events into the scheduler's state: node changes, new slices, pods that ended."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

from tessera.cluster.builders import gpu_node
from tessera.cluster.domain import Node
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare, MigSlice
from tessera.cluster.domain.requirements import GpuRequest, Pod, PodPhase, PodRequirements
from tessera.cluster.port import EventType, WatchEvent
from tessera.scheduler.adapters.kube import InventoryBinder
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.domain.framework.builders import make_gang
from tessera.scheduler.domain.framework.cluster_view import node_info
from tessera.scheduler.domain.gang.assembly import assemble
from tessera.scheduler.domain.gang.scheduler import OutcomeKind
from tessera.scheduler.service_layer.engine_state import EngineState
from tessera.scheduler.service_layer.outcomes import GangInfo
from tessera.scheduler.service_layer.watches import WatchState

NO_REPO: Any = None  # node events do not touch the database


def world(*nodes: Node) -> tuple[EngineState, WatchState]:
    infos = {node.name: node_info(node) for node in nodes}
    port = InventoryBinder()
    uuids = {node.name: {gpu.index: gpu.uuid for gpu in node.gpus} for node in nodes}
    state = EngineState(assemble(infos.values(), port), {}, {}, uuids, infos, port)
    settings = SchedulerSettings.model_validate({})
    return state, WatchState(state, NO_REPO, settings, now=100.0)


def node_event(node: Node, kind: EventType = EventType.MODIFIED) -> WatchEvent[Any]:
    return WatchEvent(kind, node, "1")


async def test_a_new_mig_layout_wakes_a_gang_waiting_for_slices() -> None:
    state, watches = world(gpu_node("a100-0", "A100-80GB", 1))
    scheduler = state.assembly.scheduler
    scheduler.submit(make_gang("infer", 1, gpus=0, mig=MappingProxyType({"1g.10gb": 1})))
    (outcome,) = scheduler.run(now=100.0)
    assert outcome.kind is OutcomeKind.UNSCHEDULABLE
    assert state.assembly.queue.parked() == ("infer",)

    await watches.apply(
        NO_REPO, "node", node_event(gpu_node("a100-0", "A100-80GB", 1, mig_config="all-1g.10gb"))
    )

    queue = state.assembly.queue
    assert (queue.parked(), queue.backing_off()) == ((), ("infer",)), "woken; retried when its backoff ends"
    assert state.uuids["a100-0"][0].startswith("GPU-")


async def test_an_unchanged_node_report_changes_nothing() -> None:
    node = gpu_node("gpu-0", "A100-80GB", 8)
    state, watches = world(node)
    generation = state.assembly.cache.generation
    await watches.apply(NO_REPO, "node", node_event(node))
    assert state.assembly.cache.generation == generation


async def test_a_lost_node_breaks_the_gang_on_it_and_a_pod_that_ended_frees_its_gpus() -> None:
    state, watches = world(gpu_node("gpu-0", "A100-80GB", 8), gpu_node("gpu-1", "A100-80GB", 8))
    scheduler = state.assembly.scheduler
    scheduler.submit(make_gang("train", 2, gpus=8))
    (placed,) = scheduler.run(now=100.0)
    assert placed.kind is OutcomeKind.PLACED
    state.gangs["train"] = GangInfo("train", "job", placed={a.pod: None for a in placed.bound})

    watches.pod_ended("train-0", "Succeeded")
    assert state.assembly.cache.allocation("train-0") is None
    assert state.gangs["train"].placed["train-0"] == "Succeeded"

    lost = placed.bound[1].node
    outcomes = await watches.apply(
        NO_REPO, "node", node_event(gpu_node(lost, "A100-80GB", 8), EventType.DELETED)
    )
    assert [o.kind for o in outcomes] == [OutcomeKind.BROKEN]
    assert lost not in state.nodes


async def test_pods_of_other_schedulers_hold_capacity_until_they_end() -> None:
    node = gpu_node("gpu-0", "A100-80GB", 2, cpu_milli=8_000)
    state, watches = world(node)
    gpu0 = node.gpus[0].uuid
    other = Pod(
        "kube-system",
        "daemon",
        PodRequirements(cpu_milli=6_000, memory_mib=1024),
        scheduler_name="default-scheduler",
        node_name="gpu-0",
        phase=PodPhase.RUNNING,
        assignment=DeviceAssignment("gpu-0", (GpuShare(gpu0, 1000),)),
    )
    await watches.apply(NO_REPO, "pod", WatchEvent(EventType.MODIFIED, other, "2"))

    held = state.assembly.cache.allocation("kube-system/daemon")
    assert held is not None and (held.cpu_milli, held.gpu_milli) == (6_000, ((0, 1000),))
    scheduler = state.assembly.scheduler
    scheduler.submit(make_gang("train", 1, gpus=1, cpu_milli=4_000))
    (outcome,) = scheduler.run(now=100.0)
    assert outcome.kind is OutcomeKind.UNSCHEDULABLE, "only 2 cores left"

    ended = dataclasses.replace(other, phase=PodPhase.SUCCEEDED)
    await watches.apply(NO_REPO, "pod", WatchEvent(EventType.MODIFIED, ended, "3"))
    assert state.assembly.cache.allocation("kube-system/daemon") is None
    assert state.assembly.queue.parked() == (), "the freed capacity wakes the gang"


async def test_mig_devices_held_by_pods_of_other_schedulers_are_not_offered() -> None:
    """Before, a foreign pod's MIG devices were left out of what it holds: they looked free."""
    node = gpu_node("a100-0", "A100-80GB", 1, mig_config="all-1g.10gb")  # 7 slices of 1g.10gb
    state, watches = world(node)
    by_request = Pod(
        "other",
        "infer-a",
        PodRequirements(gpu=GpuRequest.mig("1g.10gb", 4)),
        scheduler_name="default-scheduler",
        node_name="a100-0",
        phase=PodPhase.RUNNING,
    )
    slices = tuple(
        GpuShare(node.gpus[0].uuid, mig=MigSlice(i.profile, i.start, i.uuid))
        for i in node.gpus[0].mig_instances[4:]
    )
    by_assignment = dataclasses.replace(
        by_request, name="infer-b", assignment=DeviceAssignment("a100-0", slices)
    )
    for pod in (by_request, by_assignment):
        await watches.apply(NO_REPO, "pod", WatchEvent(EventType.MODIFIED, pod, "2"))

    held = [state.assembly.cache.allocation(f"other/{name}") for name in ("infer-a", "infer-b")]
    assert [a.mig if a else None for a in held] == [(("1g.10gb", 4),), (("1g.10gb", 3),)]
    scheduler = state.assembly.scheduler
    scheduler.submit(make_gang("infer", 1, gpus=0, mig=MappingProxyType({"1g.10gb": 1})))
    (outcome,) = scheduler.run(now=100.0)
    assert outcome.kind is OutcomeKind.UNSCHEDULABLE, "all 7 slices are held"


def test_a_foreign_pod_whose_mig_devices_do_not_fit_still_holds_its_cpu_and_memory() -> None:
    """The node does not advertise its MIG devices just now (its device plugin restarts): the pod's
    slices cannot be counted, but its CPU and memory are."""
    from tessera.cluster.domain.requirements import GpuRequest
    from tessera.scheduler.service_layer.watches import foreign_allocation, hold_foreign

    state, _ = world(gpu_node("n1", "A100-80GB", 1, cpu_milli=8000))
    pod = Pod(
        "x",
        "p",
        PodRequirements(cpu_milli=6000, memory_mib=1000, gpu=GpuRequest.mig("1g.10gb", 1)),
        scheduler_name="default-scheduler",
        node_name="n1",
    )
    hold_foreign(state.assembly.cache, foreign_allocation(pod, {}))
    held = state.assembly.cache.allocation("x/p")
    assert held is not None and (held.cpu_milli, held.memory_mib, held.mig) == (6000, 1000, ())
    assert state.assembly.cache.node("n1").cpu_used == 6000
