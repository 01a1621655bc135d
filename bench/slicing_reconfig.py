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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
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
from tessera.core.db.migrations import migrate
from tessera.devcluster.apiserver import NODES, PODS
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.scheduler import bootstrap as scheduler_bootstrap
from tessera.scheduler.config import SchedulerSettings
from tessera.slicing import bootstrap as slicing_bootstrap
from tessera.slicing.config import SlicingSettings
from tessera.testing.services import read_stream, reset_jetstream, running, settings_for

NODE_GPUS = 8


async def run(args: argparse.Namespace, nats_url: str, database_url: str) -> dict[str, Any]:
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
            running(scheduler_bootstrap.build(scheduler), scheduler),
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
        "window": {"window_s": args.window_s, "idle_s": args.idle_s},
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
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--nats-url", help="an existing NATS with JetStream (default: start an embedded one)")
    parser.add_argument("--database-url", help="an existing PostgreSQL (default: start an embedded one)")
    args = parser.parse_args(argv)
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
        result = asyncio.run(run(args, nats_url, database_url))
    finally:
        for h in handles:
            h.close()
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    if result["pods_bound"] < args.pods:
        print(f"only {result['pods_bound']} of {args.pods} pods bound", file=sys.stderr)


if __name__ == "__main__":
    main()
