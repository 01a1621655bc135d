"""Usage and cost accounting: who held which GPU, how much of it they used, what it cost. Pure.

Each attributed share of a reading covers the time since the previous reading of the same GPU and
container (the first one covers one sampling interval; a gap is capped at `max_gap_s`, so a
telemetry outage is not billed as use). It is added to the row of its hour (`UsageKey`):

* **allocated GPU-hours**: the share of the GPU the container held times time;
* **used GPU-hours**: its part of the GPU's utilisation times time;
* **memory GiB-hours**: its GPU memory times time;
* **idle GPU-hours**: allocated time in a run where its use stayed below `idle_below_pct` of what
  it held for longer than `idle_window_s` (the whole run counts once it is that long; the rows keep
  the run in progress, so a restart continues it);
* **cost**: allocated GPU-hours times the flavor's price per GPU-hour (spot or on-demand).

A reading without a utilisation (`utilization_known=False`: dcgm-exporter wrote NaN, or exported
neither the utilisation nor, for a MIG instance, its engine activity) still counts allocated
GPU-hours, memory and cost; not used or idle time. It leaves an idle run as it is, unless the
container has had no known utilisation for over `max_gap_s`: the run ends.

Rows are replaced, never incremented, when stored; each row keeps the time of the last reading it
counted, and a reading at or before it is a duplicate. So replaying a window counts nothing twice.
A reading from a window already closed is late and is refused (counted). A node clock that is more
than `max_skew_s` off the accountant's clock is clamped to it (counted, and the worst skew per node
reported). Readings of pods that no placement names go to job `unknown`, counted, never dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from tessera.telemetry.domain.attribution import UNKNOWN, Share
from tessera.telemetry.domain.directory import UNKNOWN_JOB as UNKNOWN_JOB
from tessera.telemetry.domain.directory import JobRef as JobRef
from tessera.telemetry.domain.directory import PodKey as PodKey
from tessera.telemetry.domain.directory import billed_to as billed_to
from tessera.telemetry.domain.pricing import Pricing

# the rows, policy and counters live in `usage_rows`; named here too for the importers of before
from tessera.telemetry.domain.usage_rows import HOUR_S as HOUR_S
from tessera.telemetry.domain.usage_rows import AccountingPolicy as AccountingPolicy
from tessera.telemetry.domain.usage_rows import AccountingStats as AccountingStats
from tessera.telemetry.domain.usage_rows import UsageKey as UsageKey
from tessera.telemetry.domain.usage_rows import UsageRow as UsageRow
from tessera.telemetry.domain.usage_rows import hour_of as hour_of


@dataclass(slots=True)
class _Run:
    """The idle run of one container on one GPU: since when (epoch seconds), and the idle seconds not
    yet credited (by hour) while the run is shorter than the window."""

    since: float
    pending: dict[datetime, float] = field(default_factory=dict)
    flagged: bool = False


@dataclass(slots=True)
class _Holding:
    """What the accountant keeps of one container on one GPU between its readings (one lookup a share)."""

    #: the time (epoch seconds) of the last reading counted
    last: float | None = None
    #: the hour of `row`, the row the next reading of that hour goes to
    hour: datetime | None = None
    row: UsageRow | None = None
    #: its idle run, while it is idle
    run: _Run | None = None
    #: the time (epoch seconds) of the last reading with a known utilisation
    known: float | None = None


class Accountant:
    """Accumulates attributed readings into hourly rows; `dirty()` hands out what changed.

    It runs for every share of every reading, so it keeps times as epoch seconds and the changed rows
    by identity (a row's key is hashed once, when the row is made)."""

    def __init__(self, policy: AccountingPolicy | None = None) -> None:
        self.policy = policy or AccountingPolicy()
        self.rows: dict[UsageKey, UsageRow] = {}
        self.stats = AccountingStats()
        #: no reading before this is counted any more: its hours are closed
        self.closed_before: datetime | None = None
        self._closed_ts = float("-inf")
        #: (GPU, namespace, pod, container) -> what is kept of it between readings
        self._holdings: dict[tuple[str, str, str, str], _Holding] = {}
        self._sums: dict[tuple[str, str, str], list[float]] = {}
        #: id(row) -> row, of the rows changed since the last `dirty()`
        self._dirty: dict[int, UsageRow] = {}
        self._hour_cache: tuple[float, float, datetime] = (0.0, 0.0, datetime.fromtimestamp(0, UTC))

    # ---- restoring -----------------------------------------------------------------------------

    def restore(self, rows: Iterable[UsageRow], closed_before: datetime | None) -> None:
        """Continue from stored rows of the open hours (after a restart): their totals, the last
        reading each counted and the idle run in progress then; readings before `closed_before` are
        late. Rows of closed hours given too add only their idle seconds pending in that run."""
        self._forget_rows()
        self._close_before(closed_before)
        latest: dict[tuple[str, str, str, str], UsageRow] = {}
        pending: dict[tuple[str, str, str, str], dict[datetime, tuple[float, float]]] = {}
        for row in rows:
            k = row.key
            run_key = (k.gpu_uuid, k.namespace, k.pod, k.container)
            if row.idle_pending_s > 0 and row.idle_run_since is not None:
                pending.setdefault(run_key, {})[k.window_start] = (row.idle_run_since, row.idle_pending_s)
            if k.window_start.timestamp() < self._closed_ts:
                continue
            self.rows[k] = row
            holding = self._holding(run_key)
            last = row.last_at.timestamp() if row.last_at is not None else None
            if last is not None and (holding.last is None or holding.last < last):
                holding.last = last
                latest[run_key] = row
        for run_key, row in latest.items():
            holding = self._holdings[run_key]
            since = row.idle_run_since
            if since is not None and holding.last is not None:
                flagged = holding.last - since >= self.policy.idle_window_s
                mine = pending.get(run_key, {}).items()  # a stale row of an earlier run is not its
                waiting = {} if flagged else {h: s for h, (of, s) in mine if of == since}
                holding.run = _Run(since, waiting, flagged)
                holding.known = holding.last

    def _holding(self, run_key: tuple[str, str, str, str]) -> _Holding:
        found = self._holdings.get(run_key)
        if found is None:
            found = self._holdings[run_key] = _Holding()
        return found

    def _forget_rows(self) -> None:
        """The next reading of each container looks its row up again (rows were dropped or replaced)."""
        for holding in self._holdings.values():
            holding.hour = holding.row = None

    def _close_before(self, boundary: datetime | None) -> None:
        self.closed_before = boundary
        self._closed_ts = float("-inf") if boundary is None else boundary.timestamp()

    # ---- counting ------------------------------------------------------------------------------

    def clamp(self, node: str, at: datetime, now: datetime) -> datetime:
        """`at`, or `now` when `at` is more than `max_skew_s` off it (counted; the worst skew per node kept)."""
        return now if self._clamped(node, at.timestamp(), now.timestamp()) else at

    def _clamped(self, node: str, ts: float, now_ts: float) -> bool:
        skew = ts - now_ts
        worst = self.stats.worst_skew_s
        if abs(skew) > abs(worst.get(node, 0.0)):
            worst[node] = skew
        if abs(skew) > self.policy.max_skew_s:
            self.stats.clamped += 1
            return True
        return False

    def _hour(self, ts: float) -> datetime:
        lo, hi, start = self._hour_cache
        if lo <= ts < hi:
            return start
        base = ts - ts % HOUR_S
        start = datetime.fromtimestamp(base, UTC)
        self._hour_cache = (base, base + HOUR_S, start)
        return start

    def add(
        self,
        node: str,
        gpu_uuid: str,
        at: datetime,
        shares: Iterable[Share],
        jobs: Mapping[PodKey, JobRef],
        pricing: Pricing,
        now: datetime | None = None,
        utilization_known: bool = True,
    ) -> None:
        """Count one GPU reading's shares; `jobs` maps pods (namespace, name) to what they are
        billed to (see `billed_to`). What it adds per tenant, queue and flavor is summed for
        `take_sums()` (the metrics). Without `utilization_known` the shares' use is not counted, nor
        that of a share not `known` (its MIG instance had no activity)."""
        policy = self.policy
        stats = self.stats
        ts = at.timestamp()
        if now is not None:
            now_ts = now.timestamp()
            if self._clamped(node, ts, now_ts):
                at, ts = now, now_ts
        stats.samples += 1
        if ts < self._closed_ts:
            stats.late += 1
            return
        hour = self._hour(ts)
        price_per_s = pricing.per_gpu_hour / HOUR_S
        interval, max_gap = policy.interval_s, policy.max_gap_s
        holdings, dirty = self._holdings, self._dirty
        for s in shares:
            holding = holdings.get((gpu_uuid, s.namespace, s.pod, s.container))
            if holding is None:
                holding = self._holding((gpu_uuid, s.namespace, s.pod, s.container))
            last = holding.last
            if last is not None and ts <= last:
                stats.duplicates += 1
                continue
            holding.last = ts
            dt = interval if last is None else min(ts - last, max_gap)
            row = holding.row
            if row is None or holding.hour is not hour:
                key = UsageKey(hour, node, gpu_uuid, s.namespace, s.pod, s.container)
                row = holding.row = self._row(key, s, jobs, pricing, at)
                holding.hour = hour
            if row.job_id == UNKNOWN or row.tenant == UNKNOWN:
                if (known := billed_to(jobs, s.namespace, s.pod)) is not None:
                    # the placement (or the job's announcement, which comes on another stream) arrived
                    # after the pod's first readings: its hour is the job's, billed to its tenant
                    row.job_id, row.queue, row.tenant = known.job_id, known.queue, known.tenant
                if row.job_id == UNKNOWN:
                    stats.unknown_pod_shares += 1
            stats.shares += 1
            allocated = s.allocated_gpus * dt
            use_known = utilization_known and s.known
            used = s.used_gpus * dt if use_known else 0.0
            cost = allocated * price_per_s
            row.allocated_gpu_s += allocated
            row.used_gpu_s += used
            row.memory_mib_s += s.memory_mib * dt
            row.cost += cost
            row.samples += 1
            row.split = s.split
            row.last_at = at
            dirty[id(row)] = row
            idle = self._idle(holding, row, s, ts, hour, dt) if use_known else self._unknown(holding, row, ts)
            group = (row.tenant, row.queue, row.flavor)
            sums = self._sums.get(group)
            if sums is None:
                sums = self._sums[group] = [0.0, 0.0, 0.0, 0.0]
            sums[0] += allocated
            sums[1] += used
            sums[2] += idle
            sums[3] += cost

    def _row(
        self, key: UsageKey, s: Share, jobs: Mapping[PodKey, JobRef], pricing: Pricing, at: datetime
    ) -> UsageRow:
        """The row of `key`, made when the hour has none yet."""
        found = self.rows.get(key)
        if found is None:
            job = billed_to(jobs, s.namespace, s.pod) or UNKNOWN_JOB
            found = self.rows[key] = UsageRow(
                key,
                job.job_id,
                job.queue,
                job.tenant,
                pricing.flavor,
                pricing.capacity_type.value,
                s.split,
                first_at=at,
            )
        return found

    def take_sums(self) -> dict[tuple[str, str, str], list[float]]:
        """(tenant, queue, flavor) -> [allocated GPU-s, used GPU-s, idle GPU-s, cost] since the last call."""
        out, self._sums = self._sums, {}
        return out

    def _idle(
        self,
        holding: _Holding,
        row: UsageRow,
        s: Share,
        ts: float,
        hour: datetime,
        dt: float,
    ) -> float:
        """Idle GPU-seconds this reading makes count (the whole pending run when it reaches the window)."""
        policy = self.policy
        holding.known = ts
        is_idle = s.allocated_gpus > 0 and s.used_gpus * 100.0 < policy.idle_below_pct * s.allocated_gpus
        run = holding.run
        if not is_idle:
            if run is not None:
                holding.run = row.idle_run_since = None
                self._settle(run, row, credit=False)
            return 0.0
        if run is None:
            run = holding.run = _Run(since=ts - dt)
        row.idle_run_since = run.since
        seconds = s.allocated_gpus * dt
        if run.flagged:
            row.idle_gpu_s += seconds
            return seconds
        run.pending[hour] = run.pending.get(hour, 0.0) + seconds
        row.idle_pending_s += seconds
        if ts - run.since < policy.idle_window_s:
            return 0.0
        run.flagged = True
        return self._settle(run, row, credit=True)

    def _unknown(self, holding: _Holding, row: UsageRow, ts: float) -> float:
        """A reading without a utilisation: the idle run in progress is kept (its row still names it,
        for a restart), unless no known utilisation came for longer than `max_gap_s`. Counts no idle."""
        run = holding.run
        if run is None:
            return 0.0
        known = holding.known if holding.known is not None else run.since
        if ts - known > self.policy.max_gap_s:
            holding.run = row.idle_run_since = None
            self._settle(run, row, credit=False)
        else:
            row.idle_run_since = run.since
        return 0.0

    def _settle(self, run: _Run, row: UsageRow, credit: bool) -> float:
        """The run's pending idle seconds leave their rows' `idle_pending_s`: counted as idle when
        `credit` (the run reached the window), else dropped (it ended shorter). Returns those counted."""
        credited = 0.0
        key = row.key
        for pending_hour, pending_s in run.pending.items():
            target = UsageKey(pending_hour, key.node, key.gpu_uuid, key.namespace, key.pod, key.container)
            into = self.rows.get(target) or row
            into.idle_pending_s = 0.0
            if credit:
                into.idle_gpu_s += pending_s
                credited += pending_s
            self._dirty[id(into)] = into
        run.pending.clear()
        return credited

    # ---- handing out ---------------------------------------------------------------------------

    def dirty(self) -> list[UsageRow]:
        """The rows changed since the last call (to store, replacing what is stored)."""
        rows = [r for r in self._dirty.values() if self.rows.get(r.key) is r]
        self._dirty.clear()
        return rows

    def mark_dirty(self, rows: Iterable[UsageRow]) -> None:
        """Rows whose storing failed: handed out again by the next `dirty()`."""
        for r in rows:
            if self.rows.get(r.key) is r:
                self._dirty[id(r)] = r

    def closing(self, now: datetime) -> list[datetime]:
        """The hours that `close(now)` would close (those it holds rows of)."""
        boundary = self._hour(now.timestamp() - self.policy.hold_s)
        return sorted({key.window_start for key in self.rows if key.window_start < boundary})

    def close(self, now: datetime) -> list[UsageRow]:
        """Close the hours that ended `hold_s` ago: they are dropped from memory (after being
        handed out by `dirty()` one last time) and later readings for them are late. What is kept of
        the containers not read since then (gone pods) is dropped too: a reading of theirs would be
        late, and one after it is counted as a first reading."""
        boundary = self._hour(now.timestamp() - self.policy.hold_s)
        closed = [row for key, row in self.rows.items() if key.window_start < boundary]
        if not closed:
            if self.closed_before is None or self.closed_before < boundary:
                self._close_before(boundary)
            return []
        for row in closed:
            del self.rows[row.key]
        self._forget_rows()
        self._close_before(boundary)
        gone = [k for k, h in self._holdings.items() if h.last is None or h.last < self._closed_ts]
        for run_key in gone:
            del self._holdings[run_key]
        return closed
