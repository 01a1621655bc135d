"""Admission throughput and latency, through the service layer on PostgreSQL.

    python -m bench.admission --json bench/results/admission.json

1. Throughput: 10,000 queued jobs across 50 queues (cohorts of 10, two GPU flavors, quota for
   about 60% of the demand). One admission cycle runs as the service runs it: take the cycle
   lock, rebuild the engine from the tables, decide, write every admission, history entry and
   outbox event, commit. Reported as admissions per second, beside the pure engine's figure
   for the same shape of work (`run_cycle_benchmark`, no I/O).
2. Latency: with capacity free, jobs are submitted one by one at a steady pace to a running
   admission service (its background cycle, outbox relay and NATS); submit -> admitted is
   measured at a NATS subscriber that receives `job_admitted`, p50 and p99.

PostgreSQL and NATS are started embedded unless --database-url / --nats-url are given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from tessera.admission.adapters import orm
from tessera.admission.adapters.config_repository import ConfigRepository
from tessera.admission.domain.documents import QueueingDocument
from tessera.admission.domain.queueing.benchmark import run_cycle_benchmark
from tessera.admission.domain.workloads import groups_of
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork as UnitOfWork
from tessera.contracts.jobs import JobSpec
from tessera.core.db.engine import make_engine, make_session_factory

FLAVORS = ("a100", "t4")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def workload(
    jobs: int, queues: int, per_cohort: int, fill: float, seed: int
) -> tuple[dict[str, Any], list[JobSpec]]:
    """The same shape of work as the pure engine's benchmark, as configuration and job specs."""
    rng = random.Random(seed)
    specs = []
    demand = [0] * queues
    for i in range(jobs):
        q = rng.randrange(queues)
        per_pod = rng.choice((1, 1, 2, 4, 8))
        pods = rng.choice((1, 1, 2, 4))
        models = list(rng.choice(((), ("A100",), ("T4",))))
        demand[q] += per_pod * pods
        specs.append(
            JobSpec.model_validate(
                {
                    "name": f"job-{i}",
                    "tenant": f"tenant-{q}",
                    "priority": rng.choice((0, 0, 10, 100)),
                    "pod_groups": [
                        {"name": "w", "replicas": pods, "gpu": {"count": per_pod, "models": models}}
                    ],
                }
            )
        )
    config = {
        "flavors": [{"name": f} for f in FLAVORS],
        "queues": [
            {
                "name": f"q{q}",
                "cohort": f"cohort-{q // per_cohort}",
                "quotas": [
                    {"flavor": f, "resources": {"gpu": max(32, int(demand[q] * fill / 2))}} for f in FLAVORS
                ],
            }
            for q in range(queues)
        ],
        "tenant_queues": [{"tenant": f"tenant-{q}", "queue": f"q{q}"} for q in range(queues)],
        "fair_sharing": {"enabled": True, "usage_half_life_s": 3600},
    }
    return config, specs


async def apply(uow: UnitOfWork, config: dict[str, Any]) -> None:
    repo = ConfigRepository(uow.session)
    before = await repo.load()
    after = before.merged(QueueingDocument.model_validate(config))
    after.build()
    await repo.save(before, after)


async def service_cycle(database_url: str, jobs: int, queues: int, seed: int) -> dict[str, Any]:
    from tessera.admission.service_layer.cycle import run_cycle

    config, specs = workload(jobs, queues, 10, 0.6, seed)
    engine = make_engine(database_url, pool_size=2)
    sessions = make_session_factory(engine)
    try:
        async with UnitOfWork(sessions, orm.outbox, orm.inbox, "bench") as uow:
            await apply(uow, config)
            start = datetime.now(UTC) - timedelta(seconds=jobs)
            rows = [
                {
                    "id": f"job-{i}",
                    "name": s.name,
                    "tenant": s.tenant,
                    "queue": s.tenant.replace("tenant-", "q"),
                    "cluster_queue": s.tenant.replace("tenant-", "q"),
                    "priority": s.priority,
                    "state": "queued",
                    "spec": s.model_dump(mode="json"),
                    "workload": {"groups": groups_of(s), "preemptible": True, "checkpointable": False},
                    "submitted_at": start + timedelta(seconds=i),
                    "updated_at": start + timedelta(seconds=i),
                }
                for i, s in enumerate(specs)
            ]
            await uow.session.execute(insert(orm.jobs), rows)
            await uow.commit()
        began = time.perf_counter()
        async with UnitOfWork(sessions, orm.outbox, orm.inbox, "bench") as uow:
            report = await run_cycle(uow)
        cycle_s = time.perf_counter() - began
    finally:
        await engine.dispose()
    return {
        "admitted": len(report.admitted),
        "waiting": report.waiting,
        "cycle_s": cycle_s,
        "admissions_per_s": len(report.admitted) / cycle_s,
    }


async def submit_latency(nats_url: str, database_url: str, jobs: int, rate: float) -> list[float]:
    import nats

    from tessera.admission import bootstrap
    from tessera.admission.config import AdmissionSettings
    from tessera.admission.service_layer.handlers import submit_job
    from tessera.contracts import subjects
    from tessera.testing.services import running, settings_for

    settings = settings_for(AdmissionSettings, nats_url, database_url, cycle_interval_s=0.2)
    received: dict[str, float] = {}
    done = asyncio.Event()
    nc = await nats.connect(nats_url)

    async def on_admitted(msg: Any) -> None:
        job_id = (msg.headers or {}).get("ce-subject", "")
        received.setdefault(job_id, time.perf_counter())
        if len(received) >= jobs:
            done.set()

    await nc.subscribe(subjects.JOB_ADMITTED, cb=on_admitted)
    sent: dict[str, float] = {}
    try:
        async with running(bootstrap.build(settings), settings) as service:
            async with service.ctx.uow() as uow:
                await apply(
                    uow,
                    {
                        "flavors": [{"name": "a100"}],
                        "queues": [
                            {"name": "free", "quotas": [{"flavor": "a100", "resources": {"gpu": 10**6}}]}
                        ],
                        "tenant_queues": [{"tenant": "bench", "queue": "free"}],
                    },
                )
                await uow.commit()
            for i in range(jobs):
                job_id = f"lat-{uuid.uuid4().hex[:12]}"
                spec = {
                    "name": f"lat-{i}",
                    "tenant": "bench",
                    "pod_groups": [{"name": "w", "replicas": 1, "gpu": {"count": 1}}],
                }
                sent[job_id] = time.perf_counter()
                async with service.ctx.uow() as uow:
                    await submit_job(spec, uow, job_id)
                    await uow.commit()
                service.deps.wake_cycle()  # as the REST handler does after a submission
                await asyncio.sleep(1 / rate)
            await asyncio.wait_for(done.wait(), timeout=60)
    finally:
        await nc.close()
    return [(received[j] - sent[j]) * 1000 for j in sent if j in received]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from tessera.core.db.migrations import migrate
    from tessera.testing.infra import create_database, resolve_nats, resolve_postgres, with_database

    handles = []
    nats_url, server_url = args.nats_url, args.database_url
    if not nats_url:
        handle = resolve_nats()
        handle.start()
        handles.append(handle)
        nats_url = handle.url
    if not server_url:
        pg = resolve_postgres()
        pg.start()
        handles.append(pg)
        server_url = pg.url
    try:
        urls = []
        for _ in range(2):
            url = with_database(server_url, create_database(server_url))
            await asyncio.to_thread(migrate, "admission", url)
            urls.append(url)
        print(f"pure engine: one cycle over {args.jobs} jobs in {args.queues} queues ...", file=sys.stderr)
        pure = run_cycle_benchmark(queues=args.queues, jobs=args.jobs, seed=args.seed)
        print("service layer on PostgreSQL: the same, one cycle ...", file=sys.stderr)
        service = await service_cycle(urls[0], args.jobs, args.queues, args.seed)
        print(f"submit -> admitted: {args.latency_jobs} jobs at {args.rate:g}/s ...", file=sys.stderr)
        latencies = await submit_latency(nats_url, urls[1], args.latency_jobs, args.rate)
    finally:
        for h in handles:
            h.close()
    return {
        "admissions_per_s": service["admissions_per_s"],
        "submit_to_admitted_p50_ms": percentile(latencies, 0.5),
        "submit_to_admitted_p99_ms": percentile(latencies, 0.99),
        "submit_to_admitted_mean_ms": statistics.fmean(latencies) if latencies else float("nan"),
        "service_cycle_s": service["cycle_s"],
        "service_admitted": service["admitted"],
        "service_waiting": service["waiting"],
        "pure_engine_admissions_per_s": pure.admissions_per_s,
        "pure_engine_cycle_s": pure.cycle_s,
        "pure_engine_admitted": pure.admitted,
        "jobs": args.jobs,
        "queues": args.queues,
        "latency_jobs": len(latencies),
        "latency_rate_per_s": args.rate,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.admission",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--jobs", type=int, default=10_000, help="queued jobs for the throughput cycle (10000)"
    )
    parser.add_argument("--queues", type=int, default=50, help="queues, in cohorts of 10 (50)")
    parser.add_argument("--latency-jobs", type=int, default=300, help="jobs submitted for latency (300)")
    parser.add_argument("--rate", type=float, default=50.0, help="submissions per second for latency (50)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--nats-url", help="an existing NATS with JetStream (default: start an embedded one)")
    parser.add_argument("--database-url", help="an existing PostgreSQL server (default: an embedded one)")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.queues < 1 or args.latency_jobs < 1 or args.rate <= 0:
        parser.error("--jobs, --queues and --latency-jobs must be at least 1, --rate above 0")
    result = asyncio.run(run(args))
    print(f"{'path':<44}{'admissions/s':>14}{'admitted':>10}{'cycle s':>10}")
    print(
        f"{'service layer (Postgres, one cycle)':<44}{result['admissions_per_s']:>14.0f}"
        f"{result['service_admitted']:>10}{result['service_cycle_s']:>10.2f}"
    )
    print(
        f"{'pure engine (no I/O, same work)':<44}{result['pure_engine_admissions_per_s']:>14.0f}"
        f"{result['pure_engine_admitted']:>10}{result['pure_engine_cycle_s']:>10.2f}"
    )
    print(
        f"submit -> admitted at {result['latency_rate_per_s']:g}/s, capacity free: "
        f"p50 {result['submit_to_admitted_p50_ms']:.1f} ms, p99 {result['submit_to_admitted_p99_ms']:.1f} ms "
        f"({result['latency_jobs']} jobs)"
    )
    print("target: >= 500 admissions/s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
