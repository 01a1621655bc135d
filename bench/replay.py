"""The openb trace through the full path: devcluster API server → scheduler → binding → kubelet.

Starts ``tessera up`` (the devcluster simulating the openb node list, and the scheduler) in a state
directory of its own, replays a slice of the openb pod list with the devcluster's replayer (as
``tessera devcluster replay`` does), and watches every pod through the Kubernetes API until it is
bound, ends, or the drain timeout passes. Reports pods bound per second and the create→bound latency
(p50, p99), how the pods ended, and the CPU the scheduler and the devcluster used, in all and per pod
replayed, side by side, so the emulated API server's own cost stays visible.

Pods arrive at the trace's creation times divided by ``--speed`` (``--speed 1e6``: as fast as they can
be created, the scheduler saturated), or with ``--rate`` at a steady rate per second in trace order,
for latency at a known load. A pod list without ``creation_time`` (or ``gpu_spec``) replays too: in
file order, without model constraints.

Each pod is created as the trace has it (no PodGroup), or with ``--gangs`` as a gang of one (a
PodGroup with minMember 1 and the pod-group label), the form the scheduler's native-gang path takes.

Run ``python -m bench.replay --help``. Data: Alibaba GPU cluster trace 2023 (openb), from
alibaba/clusterdata, cluster-trace-gpu-v2023.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped]

from bench._replay_result import BACKLOG, Result, backlog_rate, per_pod, percentile, print_table, summarise
from bench._replay_stack import ROOT, TRACE_LABEL, PodRecord, PodWatch, Stack
from tessera.devcluster import data
from tessera.devcluster.replay import ReplayReport, TraceError

__all__ = [
    "BACKLOG",
    "DEFAULT_JSON",
    "DEFAULT_NODES",
    "DEFAULT_PODS",
    "ROOT",
    "TRACE_LABEL",
    "Creators",
    "PodRecord",
    "PodWatch",
    "Result",
    "Stack",
    "backlog_rate",
    "build_parser",
    "main",
    "per_pod",
    "percentile",
    "print_table",
    "run",
    "summarise",
]

DEFAULT_PODS = data.trace(data.OPENB_PODS)  # in the repository, or under $TESSERA_DATA_DIR
DEFAULT_NODES = data.trace(data.OPENB_NODES)
DEFAULT_JSON = ROOT / "bench" / "results" / "replay.json"


# -- the run --------------------------------------------------------------------------------------------
class Creators:
    """Creates pods on up to ``count`` threads at once (1: on the replayer's own thread, in order).

    A creation waits for a free thread, so a pod is never late by more than the ones ahead of it
    take; pods the API server rejected are reported by :meth:`settle` as the replayer reports its own.
    """

    def __init__(self, create: Callable[[dict[str, Any]], None], count: int) -> None:
        self._create = create
        self._count = count
        self._slots = threading.BoundedSemaphore(count)
        self._pool = ThreadPoolExecutor(count, thread_name_prefix="create") if count > 1 else None
        self._failed: dict[str, str] = {}

    def create(self, manifest: dict[str, Any]) -> None:
        if self._pool is None:
            self._create(manifest)
            return
        self._slots.acquire()
        self._pool.submit(self._run, manifest)

    def _run(self, manifest: dict[str, Any]) -> None:
        try:
            self._create(manifest)
        except Exception as exc:  # a rejected pod is reported, as the replayer does
            self._failed[manifest["metadata"]["name"]] = str(exc)
        finally:
            self._slots.release()

    def settle(self, report: ReplayReport) -> ReplayReport:
        """Wait for every creation started; the report then names the pods that were created."""
        if self._pool is None:
            return report
        self._pool.shutdown(wait=True)
        report.created = [name for name in report.created if name not in self._failed]
        report.failed.extend(self._failed.items())
        return report


def _cpu(process: psutil.Process) -> float:
    """User plus system CPU seconds; NaN when the process is gone (restarted by the supervisor)."""
    try:
        return float(sum(process.cpu_times()[:2]))
    except psutil.NoSuchProcess:
        return float("nan")


def run(args: argparse.Namespace, env: dict[str, str] | None = None) -> Result:
    """One replay on a stack of its own; ``env`` is added to the services' environment (settings)."""
    from tessera.cli.devcluster import devcluster_url, http_pod_creator
    from tessera.devcluster.replay import Replayer, load_trace

    trace = load_trace(args.pods, skip=args.skip, limit=args.limit)
    root = Path(tempfile.mkdtemp(prefix="tessera-bench-replay-"))
    root.chmod(0o755)  # PostgreSQL's own user must traverse it
    stack = Stack(root / "state", args.nodes, args.speed, args.services, env)
    try:
        endpoints = stack.wait_ready()
        url = devcluster_url(Path(endpoints["kubeconfig"]))
        watcher = PodWatch(url, args.namespace)
        watcher.start()
        http = httpx.Client(timeout=30)
        processes = stack.processes()
        cpu_before = {n: _cpu(p) for n, p in processes.items()}
        creators = Creators(
            http_pod_creator(http, url, gangs=args.gangs, on_created=watcher.created), args.creators
        )
        replayer = Replayer(creators.create, speed=args.speed, rate=args.rate, namespace=args.namespace)
        started = time.monotonic()
        report = creators.settle(replayer.run(trace))
        replay_seconds = time.monotonic() - started
        last_progress, last = time.monotonic(), (-1, -1)
        while time.monotonic() - last_progress < args.drain_timeout:
            counts = watcher.counts()
            if counts[0] >= len(report.created):
                break
            if counts != last:
                last, last_progress = counts, time.monotonic()
            time.sleep(0.5)
        cpu = {n: round(_cpu(p) - cpu_before[n], 2) for n, p in processes.items()}
        watcher.stop()
        http.close()
    finally:
        stack.stop()
    return summarise(
        args, trace_size=len(trace), report=report, watcher=watcher, replay_seconds=replay_seconds, cpu=cpu
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pods", type=Path, default=DEFAULT_PODS, help="openb pod list (default: %(default)s)"
    )
    parser.add_argument(
        "--nodes",
        type=Path,
        default=DEFAULT_NODES,
        help="cluster the devcluster simulates (default: %(default)s)",
    )
    parser.add_argument(
        "--skip", type=int, default=2000, help="skip the first N pods of the trace (default: 2000)"
    )
    parser.add_argument("--limit", type=int, default=1000, help="pods to replay (default: 1000)")
    parser.add_argument(
        "--speed",
        type=float,
        default=5000.0,
        help="trace and devcluster seconds per wall second (default: 5000)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        metavar="PODS_PER_S",
        help="create pods at this steady rate, in trace order, instead of at the trace's times / --speed",
    )
    parser.add_argument(
        "--creators",
        type=int,
        default=1,
        help="threads creating pods at once (default: 1, one after another in trace order)",
    )
    parser.add_argument("--gangs", action="store_true", help="create each pod as a gang of one (a PodGroup)")
    parser.add_argument("--services", default="scheduler", help="services to run (default: scheduler)")
    parser.add_argument("--namespace", default="default")
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        help="seconds without progress before giving up (default: 60)",
    )
    parser.add_argument(
        "--json", type=Path, default=None, help=f"write the result here (e.g. {DEFAULT_JSON})"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for flag, path in (("--pods", args.pods), ("--nodes", args.nodes)):
        if not path.is_file():
            print(f"{flag}: {path} is not a file (set TESSERA_DATA_DIR or pass the path)", file=sys.stderr)
            return 2
    if (
        args.limit < 1
        or args.skip < 0
        or args.speed <= 0
        or (args.rate is not None and args.rate <= 0)
        or args.creators < 1
    ):
        print(
            "--limit must be >= 1, --skip >= 0, --speed > 0, --rate > 0 and --creators >= 1", file=sys.stderr
        )
        return 2
    try:
        result = run(args)
    except TraceError as exc:
        print(f"--pods: {exc}", file=sys.stderr)
        return 2
    print_table(result)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(asdict(result), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0 if result.bound == result.created and result.created > 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
