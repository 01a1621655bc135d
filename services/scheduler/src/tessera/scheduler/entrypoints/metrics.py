"""The scheduler's operational metrics on the service's registry.

Gauges are read at scrape time from what the last cycle left: the cache's frozen snapshot (GPUs
allocated and capacity per model, and their fragmentation under the score's typical workload) and
the gang queue's sizes. They are taken on the event loop when a cycle ends, never while the cycle's
thread runs, so a scrape reads only immutable objects. The histograms are observed when a cycle
ends: its duration, and for each gang bound in it the time since the cycle that took it in (the
admission's delivery to the scheduler is the consumer lag, not counted here) and, for a job, the
time since its submission. A cycle that rebuilt the state observes no latency: what it found had
waited since a time it cannot know, and what it recovered was bound before.

Families (all ``tessera_scheduler_*``):

- ``gpus_capacity{model}``, ``gpus_allocated{model}`` (fractional GPUs count by their milli),
  ``gpus_unhealthy{model}``
- ``fragmented_gpus{model}``: the expected idle GPU the typical pods could not use (FGD)
- ``pending_gangs{state}`` (active, backing_off, parked), ``pending_pods``
- ``bind_latency_seconds``, ``submission_to_bound_seconds``, ``cycle_duration_seconds`` (histograms)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tessera.scheduler.domain.gang.scheduler import GangOutcome, OutcomeKind
from tessera.scheduler.domain.placement import ClusterState, FragmentationModel, NodeSpec, TypicalPod
from tessera.scheduler.domain.snapshot import MILLI_PER_GPU, NodeInfo, Snapshot
from tessera.scheduler.service_layer.engine import SchedulingEngine
from tessera.scheduler.service_layer.engine_state import EngineState

# From a second to an hour: a gang may wait for quota freed elsewhere, or for a whole node.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class CycleView:
    """What a scrape reads: immutable, replaced whole when a cycle ends."""

    snapshot: Snapshot
    typical: tuple[TypicalPod, ...]
    active: int
    backing_off: int
    parked: int
    pending_pods: int

    @cached_property
    def gpus(self) -> dict[str, tuple[int, float, int]]:
        """Per model: capacity, allocated, unhealthy (computed once per view, at its first scrape)."""
        return gpu_totals(self.snapshot.nodes.values())

    @cached_property
    def fragmented(self) -> dict[str, float]:
        return fragmented_gpus(self.snapshot, self.typical)


def gpu_totals(nodes: Iterable[NodeInfo]) -> dict[str, tuple[int, float, int]]:
    """Per GPU model: (capacity, GPUs allocated, unhealthy GPUs)."""
    totals: dict[str, tuple[int, float, int]] = {}
    for node in nodes:
        if len(node.models) == 1:  # the usual node: its derived sums, not a walk of its GPUs
            (model,) = node.models
            unhealthy = sum(1 for gpu in node.gpus if not gpu.healthy) if node.has_unhealthy else 0
            _add(totals, model, node.gpu_count, node.gpu_milli_used, unhealthy)
            continue
        for gpu in node.gpus:
            _add(totals, gpu.model, 1, gpu.milli_used, 0 if gpu.healthy else 1)
    return totals


def _add(totals: dict[str, tuple[int, float, int]], model: str, gpus: int, milli: int, bad: int) -> None:
    capacity, allocated, unhealthy = totals.get(model, (0, 0.0, 0))
    totals[model] = (capacity + gpus, allocated + milli / MILLI_PER_GPU, unhealthy + bad)


def fragmented_gpus(snapshot: Snapshot, typical: tuple[TypicalPod, ...]) -> dict[str, float]:
    """Per GPU model, the fragmentation (in GPUs) of the snapshot's nodes, as the Fragmentation
    score measures it: idle GPU that the typical pods could no longer use."""
    nodes = [node for node in snapshot.nodes.values() if node.gpus]
    if not nodes or not typical:
        return {}
    models = sorted({node.gpus[0].model for node in nodes})
    placeholder = ClusterState([NodeSpec(f"model-{i}", 0, 0, 0, m) for i, m in enumerate(models)])
    index = {model: i for i, model in enumerate(placeholder.models)}
    model = FragmentationModel(list(typical), placeholder)
    by_size: dict[int, list[NodeInfo]] = {}
    for node in nodes:
        by_size.setdefault(len(node.gpus), []).append(node)
    result = dict.fromkeys(models, 0.0)
    for group in by_size.values():
        values = model.evaluate(
            np.array([n.cpu_milli - n.cpu_used for n in group], dtype=np.int64),
            np.array(
                [[g.idle_milli if g.offered else 0 for g in n.gpus] for n in group], dtype=np.int64
            ).reshape(len(group), -1),
            np.array([index[n.gpus[0].model] for n in group], dtype=np.int64),
        )
        for node, value in zip(group, values.tolist(), strict=True):
            result[node.gpus[0].model] += max(0.0, value) / MILLI_PER_GPU
    return result


class SchedulerCollector(Collector):
    """Gauges read from the view of the last cycle (none before the first)."""

    def __init__(self) -> None:
        self.view: CycleView | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        capacity = GaugeMetricFamily(
            "tessera_scheduler_gpus_capacity", "GPUs the scheduler sees, by model", labels=["model"]
        )
        allocated = GaugeMetricFamily(
            "tessera_scheduler_gpus_allocated",
            "GPUs allocated to pods (fractions count by their share), by model",
            labels=["model"],
        )
        unhealthy = GaugeMetricFamily(
            "tessera_scheduler_gpus_unhealthy", "GPUs marked unhealthy, by model", labels=["model"]
        )
        fragmented = GaugeMetricFamily(
            "tessera_scheduler_fragmented_gpus",
            "Idle GPU the typical workload could not use (FGD fragmentation), by model",
            labels=["model"],
        )
        gangs = GaugeMetricFamily(
            "tessera_scheduler_pending_gangs", "Gangs waiting to be placed, by queue state", labels=["state"]
        )
        pods = GaugeMetricFamily("tessera_scheduler_pending_pods", "Pods of the gangs waiting to be placed")
        view = self.view
        if view is not None:
            for name, (cap, alloc, bad) in sorted(view.gpus.items()):
                capacity.add_metric([name], cap)
                allocated.add_metric([name], alloc)
                unhealthy.add_metric([name], bad)
            for name, value in sorted(view.fragmented.items()):
                fragmented.add_metric([name], value)
            for state, count in (
                ("active", view.active),
                ("backing_off", view.backing_off),
                ("parked", view.parked),
            ):
                gangs.add_metric([state], count)
            pods.add_metric([], view.pending_pods)
        yield from (capacity, allocated, unhealthy, fragmented, gangs, pods)


class SchedulerMetrics:
    """The scheduler's families, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.collector = SchedulerCollector()
        registry.register(self.collector)
        self.bind_latency = Histogram(
            "tessera_scheduler_bind_latency_seconds",
            "From the cycle that took an admitted gang in to every pod of it bound",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.submission_to_bound = Histogram(
            "tessera_scheduler_submission_to_bound_seconds",
            "From a job's submission to admission to every pod of its gang bound",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.cycle_seconds = Histogram(
            "tessera_scheduler_cycle_duration_seconds",
            "Duration of one scheduling cycle (failed ones included)",
            buckets=CYCLE_BUCKETS,
            registry=registry,
        )


class MeteredEngine(SchedulingEngine):
    """The scheduling engine, observed by :class:`SchedulerMetrics` at the end of each cycle."""

    metrics: SchedulerMetrics | None = None

    def observe_with(self, metrics: SchedulerMetrics) -> MeteredEngine:
        self.metrics = metrics
        self._taken_in: dict[str, float | None] = {}
        """When each gang known to the engine joined its queue (None: found by a rebuild)."""
        return self

    async def run(self, stop: asyncio.Event) -> None:
        """Decide until ``stop``; a replica that stops deciding (lost the lease) shows no gauges,
        so that only the leader's count."""
        try:
            await super().run(stop)
        finally:
            if self.metrics is not None:
                self.metrics.collector.view = None

    async def cycle(self) -> list[GangOutcome]:
        metrics = self.metrics
        if metrics is None:
            return await super().cycle()
        before = self.state
        bound_before = {g for g, info in before.gangs.items() if info.placed} if before else set()
        started, taken_in = time.perf_counter(), self.clock()
        try:
            outcomes = await super().cycle()
        finally:
            metrics.cycle_seconds.observe(time.perf_counter() - started)
        state = self.state
        if state is None:
            return outcomes
        if state is not before:  # rebuilt: what it found waited since a time it cannot know
            self._taken_in = dict.fromkeys(state.gangs)
            return self._keep_view(metrics, state, outcomes)
        now = self.clock()
        for outcome in outcomes:
            info = state.gangs.get(outcome.gang)
            if outcome.kind is not OutcomeKind.PLACED or outcome.gang in bound_before or info is None:
                continue
            since = self._taken_in.get(outcome.gang, taken_in)
            if since is not None:
                metrics.bind_latency.observe(max(0.0, now - since))
            if info.submitted_at is not None:
                metrics.submission_to_bound.observe(max(0.0, now - info.submitted_at))
        self._taken_in = {g: self._taken_in.get(g, taken_in) for g in state.gangs}
        return self._keep_view(metrics, state, outcomes)

    def _keep_view(
        self, metrics: SchedulerMetrics, state: EngineState, outcomes: list[GangOutcome]
    ) -> list[GangOutcome]:
        queue, registry = state.assembly.queue, state.assembly.registry
        backing_off, parked = len(queue.backing_off()), len(queue.parked())
        metrics.collector.view = CycleView(
            snapshot=state.assembly.cache.snapshot(),
            typical=state.fragmentation.typical if state.fragmentation is not None else (),
            active=len(queue) - backing_off - parked,
            backing_off=backing_off,
            parked=parked,
            pending_pods=sum(
                len(spec.members) - registry.placed(spec.name)
                for spec in registry.gangs()
                if spec.name in queue
            ),
        )
        return outcomes
