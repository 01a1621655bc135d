"""Usage and cost accounting in the service: the job directory from admission's and the scheduler's
events, each round's readings attributed and counted, rows stored, rightsizing findings published.

The handlers keep the directory in Postgres (`jobs`, `pod_placements`) and in memory (the ledger's
`directory`), so the sampler joins pods to jobs without a query per round. Rows are stored every
`flush_interval_s` by replacing the stored row (idempotent, see `domain.usage`); a day's daily rows
are rebuilt from its hours when one of them closes (and when the sampler stops).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from tessera.contracts.events import (
    GangFinished,
    GangPlaced,
    JobAccepted,
    JobAdmitted,
    PodsEvicted,
    RightsizingRecommended,
)
from tessera.core.messaging.consumer import Handler, PermanentError
from tessera.core.messaging.envelope import Envelope
from tessera.telemetry.domain.attribution import Share
from tessera.telemetry.domain.directory import UNKNOWN_JOB, JobDirectory, PlacedPod
from tessera.telemetry.domain.model import Reading
from tessera.telemetry.domain.pricing import PriceBook, Pricing
from tessera.telemetry.domain.rightsizing import FindingKind, Recommendation, RightsizingTracker
from tessera.telemetry.domain.usage import Accountant
from tessera.telemetry.domain.usage_rows import UsageRow, hour_of
from tessera.telemetry.service_layer.unit_of_work import TelemetryUnitOfWork

log = logging.getLogger(__name__)


@dataclass
class NodeInfo:
    gpu_model: str
    labels: Mapping[str, str]
    gpu_memory_mib: dict[str, int]


@dataclass
class UsageLedger:
    """What the sampler feeds each round: attribution's shares in, rows and recommendations out."""

    accountant: Accountant
    prices: PriceBook
    rightsizing: RightsizingTracker
    directory: JobDirectory = field(default_factory=JobDirectory)
    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    recommendations: list[Recommendation] = field(default_factory=list)
    _pricing: dict[str, Pricing] = field(default_factory=dict)

    def set_nodes(self, nodes: Mapping[str, NodeInfo]) -> None:
        self.nodes = dict(nodes)
        self._pricing.clear()

    def pricing(self, node: str, model: str) -> Pricing:
        found = self._pricing.get(node)
        if found is None:
            info = self.nodes.get(node)
            found = self._pricing[node] = self.prices.pricing(
                model or (info.gpu_model if info else ""), info.labels if info else {}
            )
        return found

    def count(self, reading: Reading, shares: Sequence[Share], now: datetime | None) -> None:
        """Count one attributed reading (usage and cost) and observe each holder's use (rightsizing).
        Runs for every reading: what it looks up per node is cached. A reading without a utilisation
        counts its allocation, memory and cost, and rightsizing leaves it out (its use is unknown)."""
        node = reading.node
        pricing = self._pricing.get(node) or self.pricing(node, reading.model)
        # a node clock too far off is clamped once, for the hours and the rightsizing windows alike
        at = reading.at if now is None else self.accountant.clamp(node, reading.at, now)
        known = reading.utilization_known
        self.accountant.add(node, reading.gpu_uuid, at, shares, self.directory.refs(), pricing, None, known)
        if not shares or not known:
            return
        info = self.nodes.get(node)
        memory_total = reading.memory_total_mib or (
            info.gpu_memory_mib.get(reading.gpu_uuid, 0) if info else 0
        )
        model = reading.model or (info.gpu_model if info else "")
        observe = self.rightsizing.observe
        for s in shares:
            if s.allocated_gpus <= 0 or not s.known:
                continue
            found = observe(
                node,
                reading.gpu_uuid,
                model,
                memory_total,
                s.namespace,
                s.pod,
                s.container,
                at,
                s.allocated_gpus,
                s.used_gpus,
                s.memory_mib,
            )
            if found:
                self.recommendations.extend(found)

    def close(self, now: datetime) -> None:
        """Close the hours that are over; forget the containers not read since (gone pods)."""
        if self.accountant.close(now) and self.accountant.closed_before is not None:
            self.rightsizing.prune(self.accountant.closed_before)

    def take_recommendations(self) -> list[Recommendation]:
        out, self.recommendations = self.recommendations, []
        return out


def days_of(rows: Sequence[UsageRow]) -> list[datetime]:
    return days_of_hours({r.key.window_start for r in rows})


def days_of_hours(hours: Iterable[datetime]) -> list[datetime]:
    """The UTC midnights of these hours' days."""
    return sorted({hour_of(h).replace(hour=0) for h in hours})


async def record_usage(
    uow: TelemetryUnitOfWork, rows: Sequence[UsageRow], days: Sequence[datetime] | None = None
) -> None:
    """Store rows (replacing) and rebuild the daily rows of `days` (by default the rows' days)."""
    if rows:
        await uow.usage.save(rows)
    days = days_of(rows) if days is None else days
    if days:
        await uow.usage.rollup_days(days)


def recommendation_event(r: Recommendation, directory: JobDirectory) -> RightsizingRecommended:
    job = directory.job_of(r.namespace, r.pod) or UNKNOWN_JOB
    return RightsizingRecommended(
        kind=r.kind.value,
        namespace=r.namespace,
        pod=r.pod,
        container=r.container,
        job_id=job.job_id,
        tenant=job.tenant,
        queue=job.queue,
        node=r.node,
        gpu_uuid=r.gpu_uuid,
        gpu_model=r.gpu_model,
        window_start=r.window_start,
        window_end=r.window_end,
        samples=r.samples,
        allocated_milli=min(1000, r.allocated_milli),
        p95_utilization_pct=min(100.0, r.p95_utilization_pct),
        p95_memory_mib=r.p95_memory_mib,
        recommended_milli=r.recommended_milli,
        recommended_mig_profile=r.recommended_mig_profile,
        saving_gpu_hours_per_day=round(r.saving_gpu_hours_per_day, 3),
    )


async def record_recommendations(
    uow: TelemetryUnitOfWork, recommendations: Sequence[Recommendation], directory: JobDirectory
) -> list[RightsizingRecommended]:
    """Store each recommendation as an open finding and publish it, unless one is open already."""
    published = []
    for r in recommendations:
        event = recommendation_event(r, directory)
        if await uow.rightsizing.open(event.job_id, event.tenant, r, event.model_dump(mode="json")):
            await uow.publish(event)
            published.append(event)
    return published


@dataclass(frozen=True)
class Flushed:
    """What one flush stored: the rows, the recommendations it took and the findings it opened."""

    rows: int
    recommendations: list[Recommendation]
    opened: list[RightsizingRecommended]


async def flush_usage(
    uow_factory: Callable[[], TelemetryUnitOfWork],
    ledger: UsageLedger,
    now: datetime,
    final: bool = False,
) -> Flushed:
    """Store the changed rows (replacing) and open/publish the new rightsizing findings in one unit
    of work, then close the hours that are over. The daily rows are rebuilt when an hour of their day
    closes, in the unit that stores its last rows, not at every flush (a day's sums are a scan of its
    hours): they hold the closed hours, and on the `final` flush (the sampler stopping) the open ones
    too. On failure the rows are marked changed again and the recommendations put back, so the next
    flush stores them (and closes the hours), and the error is raised."""
    rows = ledger.accountant.dirty()
    recommendations = ledger.take_recommendations()
    closing = ledger.accountant.closing(now)
    days = days_of_hours([*closing, *(k.window_start for k in ledger.accountant.rows)] if final else closing)
    if not rows and not recommendations and not days:
        ledger.close(now)
        return Flushed(0, [], [])
    try:
        async with uow_factory() as uow:
            await record_usage(uow, rows, days)
            opened = await record_recommendations(uow, recommendations, ledger.directory)
            await uow.commit()
    except Exception:
        ledger.accountant.mark_dirty(rows)
        ledger.recommendations[:0] = recommendations
        raise
    ledger.close(now)
    return Flushed(len(rows), recommendations, opened)


async def restore_usage(
    uow: TelemetryUnitOfWork, ledger: UsageLedger, now: datetime, nodes: Sequence[str] | None
) -> int:
    """After a restart: the directory, the open hours' rows and the open rightsizing findings. The
    hours that were open when the service stopped and have closed since are rolled into their days
    (the last two stored before the open ones: an hour closes `hold_s` after it ends), and that is
    committed. The closed hours an idle run in progress may have begun in are read too, for the idle
    seconds the run holds there. Returns how many open hours' rows were restored."""
    ledger.directory = await uow.directory.load()
    policy = ledger.accountant.policy
    boundary = hour_of(now - timedelta(seconds=policy.hold_s))
    rows = await uow.usage.rows_since(hour_of(boundary - timedelta(seconds=policy.idle_window_s)), nodes)
    ledger.accountant.restore(rows, boundary)
    for gpu_uuid, namespace, pod, container, kind in await uow.rightsizing.open_findings():
        ledger.rightsizing.seed_reported(gpu_uuid, namespace, pod, container, FindingKind(kind))
    latest = await uow.usage.latest_hour(boundary, nodes)
    if latest is not None:
        await uow.usage.rollup_days(days_of_hours([latest - timedelta(hours=1), latest]))
        await uow.commit()
    return len(ledger.accountant.rows)


# ---- consumers of admission's and the scheduler's events ------------------------------------------


def _parse(envelope: Envelope, *kinds: type) -> object:
    message = envelope.parse()
    if not isinstance(message, kinds):
        raise PermanentError(f"unexpected {envelope.type}")
    return message


def on_job_announced(ledger: UsageLedger) -> Handler[TelemetryUnitOfWork]:
    """`job_accepted` and `job_admitted`: the job's tenant and queue."""

    async def handle_job_announced(envelope: Envelope, uow: TelemetryUnitOfWork) -> None:
        event = _parse(envelope, JobAccepted, JobAdmitted)
        if isinstance(event, JobAccepted):
            job_id, name, tenant, queue = event.job_id, event.name, event.tenant, event.queue
        else:
            assert isinstance(event, JobAdmitted)
            spec = event.spec
            job_id, name, tenant, queue = event.job_id, spec.name, spec.tenant, spec.queue
        await uow.directory.upsert_job(job_id, name, tenant, queue, envelope.time or datetime.now(UTC))
        ledger.directory.add_job(job_id, tenant, queue)

    return handle_job_announced


def on_gang_placed(ledger: UsageLedger) -> Handler[TelemetryUnitOfWork]:
    async def handle_gang_placed(envelope: Envelope, uow: TelemetryUnitOfWork) -> None:
        event = _parse(envelope, GangPlaced)
        assert isinstance(event, GangPlaced)
        pods = [
            PlacedPod(p.pod, event.job_id, p.node, {g.uuid: g.milli for g in p.gpus}, p.namespace)
            for p in event.placements
        ]
        await uow.directory.place(pods, envelope.time or datetime.now(UTC))
        ledger.directory.place(pods)

    return handle_gang_placed


def on_pods_released(ledger: UsageLedger) -> Handler[TelemetryUnitOfWork]:
    """`gang_finished` and `pods_evicted`: the job's pods let their GPUs go; open findings about
    them end. Pods of the same names of other jobs (other tenants' namespaces) are left alone."""

    async def handle_pods_released(envelope: Envelope, uow: TelemetryUnitOfWork) -> None:
        event = _parse(envelope, GangFinished, PodsEvicted)
        at = envelope.time or datetime.now(UTC)
        if isinstance(event, GangFinished):
            named: list[str] | None = list(event.pods) or None
        else:
            assert isinstance(event, PodsEvicted)
            named = [p.partition("/")[2] or p for p in event.pods]
        job_id = event.job_id
        pods = (
            named
            if named is not None
            else [p.pod for p in ledger.directory.pods.values() if p.job_id == job_id]
        )
        await uow.directory.end_pods(job_id, named, at)
        await uow.rightsizing.end_for_pods(job_id, pods, at)
        ledger.directory.end(job_id, named)

    return handle_pods_released
