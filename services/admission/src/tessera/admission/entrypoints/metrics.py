"""Admission's operational metrics on the service's registry.

A cycle rebuilds its state from Postgres and decides; when it has committed, :meth:`observe`
observes the latency of each job it admitted and keeps what the cycle left (a state no later cycle
touches: each builds its own). The first scrape after it reads from that state the jobs pending per
queue, the jobs and usage holding quota per queue and flavor and the nominal quota. The cycle's task times each cycle.

Families (all ``tessera_admission_*``):

- ``pending_jobs{queue}``: jobs queued (waiting or inadmissible) after the last cycle
- ``admitted_jobs{queue}``: jobs holding quota
- ``quota_usage{queue,flavor,resource}``, ``quota_nominal{queue,flavor,resource}``
- ``latency_seconds`` (histogram): from a job's submission to its admission (a job preempted and
  queued again counts from its submission too: the queue keeps no time of its return)
- ``cycle_duration_seconds`` (histogram), failed cycles included
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tessera.admission.domain.model import JobState
from tessera.admission.service_layer.cycle import CycleReport
from tessera.admission.service_layer.cycle_state import CycleState

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0)
CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

FlavorResource = tuple[str, str, str]  # queue, flavor, resource


@dataclass(frozen=True)
class QueueView:
    """What a scrape reads: replaced whole after each committed cycle."""

    pending: Mapping[str, int] = field(default_factory=dict)
    admitted: Mapping[str, int] = field(default_factory=dict)
    usage: Mapping[FlavorResource, int] = field(default_factory=dict)
    nominal: Mapping[FlavorResource, int] = field(default_factory=dict)


def queue_view(state: CycleState, report: CycleReport) -> QueueView:
    """The queues as the cycle left them: its admissions count as admitted, no longer pending."""
    engine, queues = state.engine, state.config.queues
    newly = set(report.admitted)
    pending = dict.fromkeys(queues, 0)
    for job in state.jobs.values():
        if job.state is JobState.QUEUED and job.id not in newly:
            pending[job.queue] = pending.get(job.queue, 0) + 1
    admitted = dict.fromkeys(queues, 0)
    for job_id in state.jobs:
        if engine.is_admitted(job_id):
            queue = engine.admitted(job_id).queue
            admitted[queue] = admitted.get(queue, 0) + 1
    usage = {
        (queue, flavor, resource): amount
        for queue, used in engine.usage_by_queue().items()
        for (flavor, resource), amount in used.items()
    }
    nominal = {
        (name, flavor, resource): quota.nominal
        for name, spec in queues.items()
        for (flavor, resource), quota in spec.quotas.items()
    }
    return QueueView(pending, admitted, usage, nominal)


class AdmissionCollector(Collector):
    """Gauges read from the view of the last committed cycle (none before the first)."""

    def __init__(self) -> None:
        self.cycle: tuple[CycleState, CycleReport] | None = None
        """The last committed cycle, left as it was: its view is computed at the first scrape."""
        self._view: tuple[tuple[CycleState, CycleReport], QueueView] | None = None

    @property
    def view(self) -> QueueView | None:
        cycle = self.cycle
        if cycle is None:
            return None
        if self._view is None or self._view[0] is not cycle:
            self._view = (cycle, queue_view(*cycle))
        return self._view[1]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pending = GaugeMetricFamily(
            "tessera_admission_pending_jobs", "Jobs queued for admission, by queue", labels=["queue"]
        )
        admitted = GaugeMetricFamily(
            "tessera_admission_admitted_jobs", "Jobs holding quota, by queue", labels=["queue"]
        )
        usage = GaugeMetricFamily(
            "tessera_admission_quota_usage",
            "Quota held by admitted jobs, by queue, flavor and resource",
            labels=["queue", "flavor", "resource"],
        )
        nominal = GaugeMetricFamily(
            "tessera_admission_quota_nominal",
            "Nominal quota, by queue, flavor and resource",
            labels=["queue", "flavor", "resource"],
        )
        view = self.view
        if view is not None:
            for queue, count in sorted(view.pending.items()):
                pending.add_metric([queue], count)
            for queue, count in sorted(view.admitted.items()):
                admitted.add_metric([queue], count)
            for key, amount in sorted(view.usage.items()):
                usage.add_metric(list(key), amount)
            for key, amount in sorted(view.nominal.items()):
                nominal.add_metric(list(key), amount)
        yield from (pending, admitted, usage, nominal)


class AdmissionMetrics:
    """Admission's families, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.collector = AdmissionCollector()
        registry.register(self.collector)
        self.latency = Histogram(
            "tessera_admission_latency_seconds",
            "From a job's submission to its admission",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.cycle_seconds = Histogram(
            "tessera_admission_cycle_duration_seconds",
            "Duration of one admission cycle (failed ones included)",
            buckets=CYCLE_BUCKETS,
            registry=registry,
        )

    def observe(self, state: CycleState, report: CycleReport, now: datetime) -> None:
        """A committed cycle: its admissions' latency, and the queues it left."""
        for job_id in report.admitted:
            job = state.jobs.get(job_id)
            if job is not None:
                self.latency.observe(max(0.0, (now - job.submitted_at).total_seconds()))
        self.collector.cycle = (state, report)
