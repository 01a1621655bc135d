"""B5, reconfiguration on the devcluster: how long a pod asking for a MIG profile no GPU offers waits
until it is bound, and how many running pods the reconfiguration disturbs.

    python -m bench.slicing_reconfig --json bench/results/slicing_reconfig.json

Two 8-GPU A100-80GB nodes, all exclusive. Running pods hold `--busy` GPUs of the first node (each
pod its own GPU, by the device assignment the scheduler writes). Then `--pods` pods, each asking for
`nvidia.com/mig-<profile>`, are created pending. The real scheduler (it publishes `demand_changed`
and binds) and the real slicing service (it plans, cordons, writes the mig-parted config and label,
follows the MIG manager, verifies and uncordons) run in this process on real NATS and PostgreSQL
(embedded ones unless --nats-url and --database-url are given), over the official `kubernetes`
client against the devcluster's API server. The MIG manager takes `--mig-seconds` (5 s, as the
devcluster's default).

Reported, per pod: created -> `layout_planned` -> MIG manager `success` -> bound -> Running, in
seconds; slicing's demand window (`--idle-s` after the last demand signal, 10 s by default as in
production) is part of the wait and is shown on its own. Pods disturbed: running pods that were
deleted, evicted, moved or ended while it happened (the goal is 0).

`--forecast-every S` publishes the same `forecast_updated` (no GPU demand) every S seconds during the
run, as a forecaster does each step. `--compare-window` then runs the path twice per repetition
(`--repeat`, ABBA): with slicing's window as it is (a repeated input opens a window but does not hold
it open) and with the window as it was before (every input held it open, so a source repeating
itself within `--idle-s` made every plan wait the whole `--window-s`).

    python -m bench.slicing_reconfig --forecast-every 1 --compare-window --repeat 2 --json bench/results/slicing_reconfig_window_compare.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats

from tessera.cluster.builders import PodManifest
from tessera.cluster.cluster_file import NodeSpec
from tessera.cluster.conventions import MIG_CONFIG_STATE_LABEL
from tessera.cluster.conventions.assignment import encode_assignment
from tessera.cluster.conventions.names import GPU_ASSIGNMENT_ANNOTATION
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.contracts import subjects
from tessera.contracts.envelope import encode
from tessera.contracts.events import ForecastUpdated, ShapeDemand
from tessera.core.db.migrations import migrate
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.devcluster.apiserver import NODES, PODS
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.scheduler import bootstrap as scheduler_bootstrap
from tessera.scheduler.config import SchedulerSettings
from tessera.slicing import bootstrap as slicing_bootstrap
from tessera.slicing.config import SlicingSettings
from tessera.slicing.domain.demand import DemandWindow, Signal
from tessera.testing.infra import create_database, drop_database, with_database
from tessera.testing.services import read_stream, reset_jetstream, running, settings_for

NODE_GPUS = 8


class WindowAsBefore(DemandWindow):
    """Slicing's demand window before repeats stopped holding it open: every input is new."""

    def _is_new(self, signal: Signal) -> bool:
        return True


@contextlib.contextmanager
def window_as_before(before: bool) -> Iterator[None]:
    """Slicing's bootstrap builds `WindowAsBefore` while this is entered with `before`."""
    if not before:
        yield
        return
    slicing_bootstrap.DemandWindow = WindowAsBefore  # type: ignore[attr-defined,misc]
    try:
        yield
    finally:
        slicing_bootstrap.DemandWindow = DemandWindow  # type: ignore[attr-defined]


@contextlib.asynccontextmanager
async def _with(context: contextlib.AbstractContextManager[None]) -> AsyncIterator[None]:
    with context:
        yield


@contextlib.asynccontextmanager
async def repeating_forecast(nats_url: str, every_s: float) -> AsyncIterator[None]:
    """`repeat_forecast` in the background while entered (nothing when `every_s` is 0); a publisher
    that failed fails the run when it ends."""
    if not every_s:
        yield
        return
    task = asyncio.create_task(repeat_forecast(nats_url, every_s))
    try:
        yield
    finally:
        task.cancel()
        (outcome,) = await asyncio.gather(task, return_exceptions=True)
    if isinstance(outcome, Exception):
        raise RuntimeError(f"the repeated forecast stopped: {outcome!r}") from outcome


async def repeat_forecast(nats_url: str, every_s: float) -> None:
    """Publish the same forecast (no GPU demand) every `every_s` seconds until cancelled."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_stream(js, "forecaster", StreamLimits())
        while True:
            demand = [ShapeDemand(shape="A100-80GB", expected=0.0, served=0.0, source="forecast")]
            message = ForecastUpdated(at=datetime.now(UTC), window_s=60.0, demand=demand)
            subject, headers, body = encode(message, "bench.slicing_reconfig")
            await js.publish(subject, body, headers=headers)
            await asyncio.sleep(every_s)
    finally:
        await nc.close()


async def run(
    args: argparse.Namespace, nats_url: str, database_url: str, window_before: bool = False
) -> dict[str, Any]:
    await reset_jetstream(nats_url)
    for schema in ("scheduler", "slicing"):
        await asyncio.to_thread(migrate, schema, database_url)
    nodes = [NodeSpec(f"a100-{i}", 96_000, 1_048_576, "A100-80GB", NODE_GPUS, 81920, {}) for i in range(2)]
    sim = SimSettings(speed=1.0, pod_start_seconds=1.0, mig_reconfigure_seconds=args.mig_seconds)
    with tempfile.TemporaryDirectory() as tmp, DevCluster(nodes, settings=sim) as cluster:
        kubeconfig = cluster.write_kubeconfig(Path(tmp) / "kubeconfig")
        busy = _start_busy_pods(cluster, args.busy)
        await _until(lambda: all(_phase(cluster, p) == "Running" for p in busy), 30, "the busy pods running")
        before = {p: _where(cluster, p) for p in busy}
        scheduler = settings_for(SchedulerSettings, nats_url, database_url, kubeconfig=kubeconfig, poll_s=0.2)
        slicing = settings_for(
            SlicingSettings,
            nats_url,
            database_url,
            kubeconfig=kubeconfig,
            tick_s=0.2,
            planning={"window_s": args.window_s, "idle_s": args.idle_s},
        )
        async with (
            repeating_forecast(nats_url, args.forecast_every),
            running(scheduler_bootstrap.build(scheduler), scheduler),
            _with(window_as_before(window_before)),  # slicing builds its window as it starts
            running(slicing_bootstrap.build(slicing), slicing),
        ):
            created: dict[str, float] = {}
            for i in range(args.pods):
                name = f"wants-{args.profile}-{i}".replace(".", "-")
                cluster.store.create(PODS, "default", PodManifest(name).scheduler().mig(args.profile).obj())
                created[name] = time.monotonic()
            success_at: dict[str, float] = {}
            bound: dict[str, tuple[float, str]] = {}
            running_at: dict[str, float] = {}
            deadline = time.monotonic() + args.timeout_s
            while len(running_at) < len(created) and time.monotonic() < deadline:
                now = time.monotonic()
                for node in nodes:
                    labels = cluster.store.get(NODES, None, node.name)["metadata"]["labels"]
                    if labels.get(MIG_CONFIG_STATE_LABEL) == "success" and node.name not in success_at:
                        success_at[node.name] = now
                for name in created:
                    where = _where(cluster, name)
                    if where and name not in bound:
                        bound[name] = (now, where)
                    if _phase(cluster, name) == "Running" and name not in running_at:
                        running_at[name] = now
                await asyncio.sleep(0.05)
            planned = await _events(nats_url, subjects.LAYOUT_PLANNED)
            done = await _events(nats_url, subjects.RECONFIGURED)
            failed = await _events(nats_url, subjects.RECONFIG_FAILED)
        disturbed = [p for p in busy if _phase(cluster, p) != "Running" or _where(cluster, p) != before[p]]
    start = min(created.values())
    per_pod: list[dict[str, Any]] = [
        {
            "pod": name,
            "bound_s": round(bound[name][0] - created[name], 2) if name in bound else None,
            "running_s": round(running_at[name] - created[name], 2) if name in running_at else None,
            "node": bound[name][1] if name in bound else None,
        }
        for name in created
    ]
    waits: list[float] = [p["bound_s"] for p in per_pod if p["bound_s"] is not None]
    return {
        "cluster": f"2 nodes x {NODE_GPUS} A100-80GB, {args.busy} GPUs held by running pods",
        "profile": args.profile,
        "pods": args.pods,
        "pods_bound": len(waits),
        "bound_s_median": round(statistics.median(waits), 2) if waits else None,
        "bound_s_max": round(max(waits), 2) if waits else None,
        "mig_success_s": {node: round(at - start, 2) for node, at in sorted(success_at.items())},
        "window": {"window_s": args.window_s, "idle_s": args.idle_s, "as_before": window_before},
        "forecast_every_s": args.forecast_every,
        "mig_manager_s": args.mig_seconds,
        "operations": {
            "planned": len(planned),
            "reconfigured": len(done),
            "failed": len(failed),
            "duration_s": [round(e.data["duration_s"], 2) for e in done],
            "nodes": sorted({e.data["node"] for e in planned}),
        },
        "pods_disturbed": len(disturbed),
        "per_pod": per_pod,
    }


def _start_busy_pods(cluster: DevCluster, count: int) -> list[str]:
    names = []
    for i in range(count):
        share = GpuShare(NodeSpec("a100-0", 1, 1).gpu_uuid(i))
        assignment = encode_assignment(DeviceAssignment("a100-0", (share,)))
        name = f"busy-{i}"
        pod = PodManifest(name).gpus(1).annotate(GPU_ASSIGNMENT_ANNOTATION, assignment).obj()
        cluster.store.create(PODS, "default", pod)
        cluster.store.bind("default", name, "a100-0")
        names.append(name)
    return names


def _phase(cluster: DevCluster, pod: str) -> str | None:
    found = cluster.store.find(PODS, "default", pod)
    return None if found is None else (found.get("status") or {}).get("phase")


def _where(cluster: DevCluster, pod: str) -> str | None:
    found = cluster.store.find(PODS, "default", pod)
    return None if found is None else (found.get("spec") or {}).get("nodeName")


async def _until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def _events(nats_url: str, subject: str) -> list[Any]:
    nc = await nats.connect(nats_url)
    try:
        return await read_stream(nc.jetstream(), subject, idle_s=0.3)
    finally:
        await nc.close()


async def compare(args: argparse.Namespace, nats_url: str, database_url: str) -> dict[str, Any]:
    """Each repetition runs the window as before and as it is, alternating which goes first."""
    pairs: list[dict[str, dict[str, Any]]] = []
    for rep in range(args.repeat):
        pair: dict[str, dict[str, Any]] = {}
        for before in (True, False) if rep % 2 == 0 else (False, True):
            label = "before" if before else "after"
            print(f"[{rep + 1}/{args.repeat}] window {label} ...", file=sys.stderr, flush=True)
            # a database of its own: slicing resumes from the last snapshot it recorded, and the
            # scheduler knows the pods' names from the run before
            name = await asyncio.to_thread(create_database, database_url)
            try:
                url = with_database(database_url, name)
                pair[label] = await run(args, nats_url, url, window_before=before)
            finally:
                await asyncio.to_thread(drop_database, database_url, name)
        pairs.append(pair)

    def medians(label: str) -> float | None:
        waits = [p[label]["bound_s_median"] for p in pairs if p[label]["bound_s_median"] is not None]
        return round(statistics.median(waits), 2) if waits else None

    ratios = [
        round(p["after"]["bound_s_median"] / p["before"]["bound_s_median"], 3)
        for p in pairs
        if p["after"]["bound_s_median"] and p["before"]["bound_s_median"]
    ]
    return {
        "bound_s_median": {"before": medians("before"), "after": medians("after")},
        "after_over_before_per_repetition": ratios,
        "forecast_every_s": args.forecast_every,
        "pairs": pairs,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.slicing_reconfig",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--profile", default="3g.40gb", help="the MIG profile the pods ask for (default 3g.40gb)"
    )
    parser.add_argument("--pods", type=int, default=2, help="pending MIG pods (default 2)")
    parser.add_argument(
        "--busy", type=int, default=6, help="GPUs of the first node held by running pods (default 6)"
    )
    parser.add_argument("--mig-seconds", type=float, default=5.0, help="the MIG manager's time (default 5)")
    parser.add_argument("--window-s", type=float, default=60.0, help="slicing's demand window (default 60)")
    parser.add_argument(
        "--idle-s",
        type=float,
        default=10.0,
        help="the window closes this long after the last signal (default 10)",
    )
    parser.add_argument(
        "--timeout-s", type=float, default=180.0, help="give up after this long (default 180)"
    )
    parser.add_argument(
        "--forecast-every",
        type=float,
        default=0.0,
        help="publish the same forecast_updated every this many seconds during the run (default 0: none)",
    )
    parser.add_argument(
        "--compare-window",
        action="store_true",
        help="run each repetition with slicing's window as it was before too, ABBA, and report both",
    )
    parser.add_argument("--repeat", type=int, default=1, help="repetitions with --compare-window (default 1)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--nats-url", help="an existing NATS with JetStream (default: start an embedded one)")
    parser.add_argument("--database-url", help="an existing PostgreSQL (default: start an embedded one)")
    args = parser.parse_args(argv)
    if args.forecast_every < 0 or args.repeat < 1:
        parser.error("--forecast-every must be >= 0 and --repeat >= 1")
    if args.repeat > 1 and not args.compare_window:
        parser.error("--repeat is for --compare-window")
    from tessera.testing.infra import resolve_nats, resolve_postgres

    handles = []
    nats_url, database_url = args.nats_url, args.database_url
    if not nats_url:
        handle = resolve_nats()
        handle.start()
        handles.append(handle)
        nats_url = handle.url
    if not database_url:
        pg = resolve_postgres()
        pg.start()
        handles.append(pg)
        database_url = pg.url
    try:
        if args.compare_window:
            result = asyncio.run(compare(args, nats_url, database_url))
        else:
            result = asyncio.run(run(args, nats_url, database_url))
    finally:
        for h in handles:
            h.close()
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    runs = [r for pair in result["pairs"] for r in pair.values()] if args.compare_window else [result]
    for one in runs:
        if one["pods_bound"] < args.pods:
            print(f"only {one['pods_bound']} of {args.pods} pods bound", file=sys.stderr)


if __name__ == "__main__":
    main()
