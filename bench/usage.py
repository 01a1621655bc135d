"""B7 — usage and cost accounting: the GenAI duty-cycle trace through attribution and accounting.

    python -m bench.usage --json bench/results/usage.json

The Alibaba GenAI serving trace's per-container GPU duty cycle (`genai/pod_gpu_duty_cycle.csv.gz`,
143 inference containers over about 22.8 hours, one reading a minute; see the data README) is replayed
as one telemetry instance would see it, on simulated nodes of 8 A100-80GB GPUs, sampled every 10 s:

* two thirds of the containers hold a whole GPU each; the others share a GPU in pairs (500 milli
  each), and each runs at its duty cycle within its half, so a shared GPU's reading is the sum;
* each round, per node, a PodResources `List` answer (device grants: whole GPUs, `<uuid>::<n>`
  replicas) is turned into holders and each GPU reading is split among them (by process memory,
  which the readings carry), counted by the accountant (hourly rows, idle runs, cost at an on-demand
  price) and observed for rightsizing; exactly the service's `UsageLedger.count` path;
* every 30 simulated seconds (the service's `usage.flush_interval_s`) the changed rows and new
  rightsizing findings are stored by the service layer's `flush_usage`, the sampler's own code (`record_usage`,
  `record_recommendations`, one telemetry unit of work) on a new migrated database of a real
  PostgreSQL (embedded unless --database-url names a server), and the ended hours are closed (their
  days' daily rows rebuilt in the same unit of work; the last flush, as the sampler stops, rebuilds
  the open hours' days too).

Checks and figures (the rows are read back from the database):
  accounted_gpu_hours / trace_gpu_hours / error_pct
      used GPU-hours accounted against the trace's own integral (each container's duty cycle as a step
      function over its time span, times its share), which must agree within 0.5 %;
  allocated_gpu_hours, idle_flagged_gpu_hours
      GPU-hours held, and held in idle runs (under 5 % of the share for over 10 minutes);
  rightsizing_saving_gpu_hours
      for every pod recommended a smaller share: (held - recommended) x the hours it ran after the
      recommendation, what acting at once would have saved;
  flushes, rows_written, stored_rows
      what the flushes stored;
  replay_idempotent
      the last hour replayed again, into the same ledger and into one restored from the stored rows
      (a restart), and flushed, changes no stored row;
  samples_per_s, cpu_pct_per_1000_gpus
      GPU readings ingested per CPU-second of this process, counting and flushing (attribution,
      accounting, rightsizing, storing), and the CPU one telemetry instance needs for 1,000 GPUs read
      every 10 s (100 readings/s); domain_* are the same without the flush, flush_cpu_s the flush's;
  db_server_cpu_s, db_server_cpu_pct_per_1000_gpus
      the PostgreSQL server's CPU over the replay (from /proc; null when it is not a local process);
  save_cpu_ms_per_flush
      `record_usage` of one flush's rows, the old repository (--baseline: row-by-row executemany)
      against the service's, alternating on the same stored rows.
Goals: error within 0.5 %, >= 50,000 samples/s, < 5 % of one core per 1,000 GPUs.
`python -m bench.usage_compare --before REV` runs this against an earlier commit, alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import zlib
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench._usage_db import ServerCpu, UsageStore, telemetry_database
from bench._usage_trace import Pod, load_trace, place, round_input
from tessera.devcluster import data
from tessera.telemetry.config import UsageSettings
from tessera.telemetry.domain.attribution import HolderCache, split_reading
from tessera.telemetry.domain.directory import JobDirectory, PlacedPod
from tessera.telemetry.domain.model import Reading
from tessera.telemetry.domain.pricing import Flavor, PriceBook
from tessera.telemetry.domain.rightsizing import (
    FindingKind,
    Recommendation,
    RightsizingPolicy,
    RightsizingTracker,
)
from tessera.telemetry.domain.usage import HOUR_S, Accountant, AccountingPolicy, UsageRow
from tessera.telemetry.service_layer.unit_of_work import TelemetryUnitOfWork
from tessera.telemetry.service_layer.usage import NodeInfo, UsageLedger, restore_usage

RESULTS = Path(__file__).parent / "results"
INTERVAL_S = 10.0
#: the service's default: rows are stored this often (simulated seconds)
FLUSH_S: float = UsageSettings.model_fields["flush_interval_s"].default
#: illustrative on-demand price per A100-80GB GPU-hour (see examples/prices/)
PRICE = 4.10
#: the trace's containers are spread over three illustrative tenants (by a hash of their names)
TENANTS = ("search", "chat", "vision")


def build(pods: list[Pod]) -> tuple[JobDirectory, UsageLedger]:
    """The directory (each pod its own job, billed to a tenant by a hash of its name) and the ledger,
    with the service's accounting policy for a 10 s sampling interval."""
    directory = JobDirectory()
    for p in pods:
        tenant = TENANTS[zlib.crc32(p.name.encode()) % len(TENANTS)]
        directory.add_job(f"job-{p.name}", tenant, f"{tenant}-serving")
        directory.place([PlacedPod(p.name, f"job-{p.name}", p.node, {p.gpu_uuid: p.milli})])
    ledger = UsageLedger(
        Accountant(AccountingPolicy(interval_s=INTERVAL_S, max_gap_s=3 * INTERVAL_S)),
        PriceBook((Flavor("a100", "A100-80GB", None, PRICE, 1.60),)),
        RightsizingTracker(RightsizingPolicy()),
        directory,
    )
    ledger.set_nodes({n: NodeInfo("A100-80GB", {}, {}) for n in sorted({p.node for p in pods})})
    return directory, ledger


def stored(rows: list[UsageRow]) -> dict[Any, tuple[float, float, float, float, int]]:
    return {r.key: (r.allocated_gpu_s, r.used_gpu_s, r.idle_gpu_s, r.cost, r.samples) for r in rows}


def per_1000_gpus(samples: int, cpu_s: float) -> float:
    """Percent of one core for 1,000 GPUs read every INTERVAL_S, at `samples` per `cpu_s`."""
    return 100 * (1000 / INTERVAL_S) * cpu_s / samples if samples else float("inf")


def run(
    trace: Path,
    hours: float | None = None,
    report: Path | None = None,
    database_url: str | None = None,
    baseline: bool = False,
) -> dict[str, Any]:
    """Replay the trace through the service's ingest path on a new telemetry database on the
    PostgreSQL server `database_url` (an embedded one when None); `baseline` stores the hourly rows
    as before (row-by-row executemany) instead of the service's one-statement upsert."""

    async def go() -> dict[str, Any]:
        async with telemetry_database(database_url) as url:
            store = UsageStore(url, baseline)
            try:
                return await replay(store, trace, hours, report)
            finally:
                await store.close()

    return asyncio.run(go())


async def replay(store: UsageStore, trace: Path, hours: float | None, report: Path | None) -> dict[str, Any]:
    series = load_trace(trace)
    pods = place(series)
    start = min(p.series.start for p in pods)
    end = max(p.series.end for p in pods)
    if hours is not None:
        end = min(end, start + hours * HOUR_S)
    t0 = datetime.fromtimestamp(0, UTC) + timedelta(days=20000)  # the trace's times are anonymised offsets

    directory, ledger = build(pods)
    await store.store_directory(directory, t0)
    by_node: dict[str, list[Pod]] = defaultdict(list)
    for p in pods:
        by_node[p.node].append(p)
    gpus_of: dict[str, list[str]] = {n: sorted({p.gpu_uuid for p in ps}) for n, ps in by_node.items()}

    # the expected integrals, from the trace alone
    trace_used_s = sum(p.series.integral(start, end) / 100 * p.milli / 1000 for p in pods)

    backend = ServerCpu(await store.server_pid())
    samples = rounds = 0
    domain_cpu = flush_cpu = 0.0
    recommended: list[tuple[Pod, Recommendation]] = []
    replayed: list[tuple[Reading, list[Any]]] = []
    replay_from = end - HOUR_S
    last_flush = t0

    def keep(found: list[Recommendation]) -> None:
        for rec in found:
            if rec.kind is FindingKind.FITS_SMALLER_SHARE:
                recommended.append((next(p for p in pods if p.name == rec.pod), rec))

    cache = HolderCache()  # the attributor's: a node's holders derived again when its grants change
    server_before = backend.seconds()
    t = start
    while t < end:
        at = t0 + timedelta(seconds=t - start)
        nodes = round_input(by_node, gpus_of, t, at)
        began = time.process_time()
        for node, grants, readings in nodes:
            holders, _ = cache.holders(node, grants, {}, directory.placed_milli, directory.placements)
            for r in readings:
                shares = split_reading(
                    r.utilization_pct, r.memory_used_mib, holders.get(r.gpu_uuid, []), r.processes, r.model
                )
                ledger.count(r, shares, at)
                samples += 1
                if t >= replay_from:
                    replayed.append((r, shares))
        domain_cpu += time.process_time() - began
        if rounds == 0:
            last_flush = at  # the sampler's clock starts with its first round
        if (at - last_flush).total_seconds() >= FLUSH_S:  # the sampler's cadence (`_account`)
            began = time.process_time()
            keep(await store.flush(ledger, at))
            flush_cpu += time.process_time() - began
            last_flush = at
        rounds += 1
        t += INTERVAL_S
    end_at = t0 + timedelta(seconds=t - start)
    began = time.process_time()
    keep(await store.flush(ledger, end_at, final=True))  # the sampler's last flush, when it stops
    flush_cpu += time.process_time() - began
    server_after = backend.seconds()
    flush_stats = dict(vars(store.stats))

    since = t0 - timedelta(days=1)
    rows = await store.rows(since)
    before = stored(rows)
    counts = await store.counts()
    per_flush = max(1, flush_stats["rows_written"] // max(1, flush_stats["flushes"]))
    save_ms = await store.compare_save(rows, per_flush, 200)

    # the last hour again: once into the same ledger, once into a restarted one restored from the rows
    for r, shares in replayed:
        ledger.count(r, shares, r.at)
    await store.flush(ledger, end_at)
    same_ledger_unchanged = stored(await store.rows(since)) == before
    _, restarted = build(pods)
    async with store.uow() as uow:
        restored = await restore_usage(uow, restarted, end_at, None)
    for r, shares in replayed:
        restarted.count(r, shares, r.at)
    await store.flush(restarted, end_at)
    restart_unchanged = stored(await store.rows(since)) == before

    if report is not None:
        write_report(rows, t0, end_at, report)
    accounted_used_s = sum(r.used_gpu_s for r in rows)
    allocated_s = sum(r.allocated_gpu_s for r in rows)
    trace_allocated_s = sum(max(0.0, min(p.series.end, end) - p.series.start) * p.milli / 1000 for p in pods)
    idle_s = sum(r.idle_gpu_s for r in rows)
    saving_h = 0.0
    for pod, rec in recommended:
        remaining_s = max(0.0, pod.series.end - (start + (rec.window_end - t0).total_seconds()))
        saving_h += rec.saving_milli / 1000 * remaining_s / HOUR_S
    cpu = domain_cpu + flush_cpu
    samples_per_s = samples / cpu if cpu > 0 else float("inf")
    cpu_pct = per_1000_gpus(samples, cpu)
    server_cpu = None if server_before is None or server_after is None else server_after - server_before
    error_pct = 100 * (accounted_used_s - trace_used_s) / trace_used_s
    return {
        "trace": str(data.GENAI_DUTY_CYCLE) if trace == data.trace(data.GENAI_DUTY_CYCLE) else str(trace),
        "containers": len(series),
        "gpus": sum(len(g) for g in gpus_of.values()),
        "shared_gpus": sum(1 for p in pods if p.milli < 1000) // 2,
        "trace_hours": round((end - start) / HOUR_S, 2),
        "interval_s": INTERVAL_S,
        "flush_interval_s": FLUSH_S,
        "rounds": rounds,
        "samples": samples,
        "accounted_gpu_hours": round(accounted_used_s / HOUR_S, 3),
        "trace_gpu_hours": round(trace_used_s / HOUR_S, 3),
        "error_pct": round(error_pct, 4),
        "allocated_gpu_hours": round(allocated_s / HOUR_S, 3),
        "trace_allocated_gpu_hours": round(trace_allocated_s / HOUR_S, 3),
        "allocated_error_pct": round(100 * (allocated_s - trace_allocated_s) / trace_allocated_s, 4),
        "cost_usd": round(sum(r.cost for r in rows), 2),
        "price_per_gpu_hour": PRICE,
        "idle_flagged_gpu_hours": round(idle_s / HOUR_S, 3),
        "rightsizing_recommendations": len(recommended),
        "rightsizing_saving_gpu_hours": round(saving_h, 3),
        "hourly_rows_stored_with": "executemany (baseline)"
        if store.unit is not TelemetryUnitOfWork
        else "unnest",
        "flushes": flush_stats["flushes"],
        "rows_written": flush_stats["rows_written"],
        "findings_opened": flush_stats["findings_opened"],
        "stored_rows": counts,
        "replay_idempotent": same_ledger_unchanged and restart_unchanged,
        "replayed_duplicates": ledger.accountant.stats.duplicates,
        "restart_restored_rows": restored,
        "restart_replay_duplicates": restarted.accountant.stats.duplicates,
        "restart_replay_late": restarted.accountant.stats.late,
        "samples_per_s": round(samples_per_s),
        "cpu_s": round(cpu, 3),
        "cpu_pct_per_1000_gpus": round(cpu_pct, 3),
        "domain_samples_per_s": round(samples / domain_cpu) if domain_cpu > 0 else None,
        "domain_cpu_s": round(domain_cpu, 3),
        "domain_cpu_pct_per_1000_gpus": round(per_1000_gpus(samples, domain_cpu), 3),
        "flush_cpu_s": round(flush_cpu, 3),
        "flush_share_of_cpu": round(flush_cpu / cpu, 3) if cpu > 0 else None,
        "save_rows_per_flush": per_flush,
        "save_cpu_ms_per_flush": save_ms,
        "save_speedup": round(save_ms["executemany"] / save_ms["unnest"], 2) if save_ms["unnest"] else None,
        "db_server_cpu_s": None if server_cpu is None else round(server_cpu, 3),
        "db_server_cpu_pct_per_1000_gpus": None
        if server_cpu is None
        else round(per_1000_gpus(samples, server_cpu), 3),
        "goals": {
            "error_within_0_5_pct": abs(error_pct) <= 0.5,
            "samples_per_s_at_least_50000": samples_per_s >= 50_000,
            "cpu_under_5_pct_per_1000_gpus": cpu_pct < 5,
        },
    }


def write_report(rows: list[Any], start: datetime, end: datetime, directory: Path) -> None:
    """The replay's rows as `tessera usage` shows telemetry's answer: a table by tenant (printed, and
    saved as text) and the PNG of `tessera usage report` (allocated vs used GPUs per hour)."""
    from rich.console import Console

    from tessera.cli import usage as cli
    from tessera.telemetry.domain.usage_report import GroupBy, totals
    from tessera.telemetry.domain.usage_series import hour_sums, shape_series
    from tessera.telemetry.entrypoints.usage_api import series_out

    def out(t: Any) -> dict[str, Any]:
        return {
            "group": t.group,
            "tenant": t.tenant,
            "queue": t.queue,
            "allocated_gpu_hours": round(t.allocated_gpu_hours, 6),
            "used_gpu_hours": round(t.used_gpu_hours, 6),
            "idle_gpu_hours": round(t.idle_gpu_hours, 6),
            "memory_gib_hours": round(t.memory_gib_hours, 6),
            "cost": round(t.cost, 6),
            "utilisation_pct": round(t.utilisation_pct, 2),
        }

    jobs = totals(rows, GroupBy.JOB)
    wasters = sorted(jobs, key=lambda j: (-j.idle_gpu_hours, j.group))[:5]
    body = {
        "by": "tenant",
        "from": start.isoformat(),
        "to": end.isoformat(),
        "tenant": None,
        "currency": "USD",
        "rows": [out(t) for t in totals(rows, GroupBy.TENANT)],
        "top_wasters": [out(j) for j in wasters],
    }
    directory.mkdir(parents=True, exist_ok=True)
    console = Console(record=True, width=120)
    cli.render(body, console)
    (directory / "usage-by-tenant.txt").write_text(console.export_text())
    # the chart of `tessera usage report`: GET /v1/usage/series's answer, built from the same rows
    sums = hour_sums(rows, GroupBy.TENANT)
    series = {**body, "series": [series_out(s) for s in shape_series(sums, start, end, 5)]}
    cli.write_series_png(series, directory / "usage-by-tenant.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--trace", type=Path, default=None, help="default: the bundled GenAI duty-cycle trace"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--hours", type=float, default=None, help="replay only the first hours (quick runs)")
    parser.add_argument(
        "--report", type=Path, default=None, help="write the table by tenant and its PNG into this directory"
    )
    parser.add_argument(
        "--database-url", default=None, help="an existing PostgreSQL server (default: an embedded one)"
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="store the hourly rows row by row (executemany), as the service did before",
    )
    args = parser.parse_args(argv)
    trace = args.trace or data.trace(data.GENAI_DUTY_CYCLE)
    result = run(trace, args.hours, args.report, args.database_url, args.baseline)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0 if all(result["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
