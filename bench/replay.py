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
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import psutil  # type: ignore[import-untyped]

from tessera.devcluster import data
from tessera.devcluster.replay import ReplayReport, TraceError

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PODS = data.trace(data.OPENB_PODS)  # in the repository, or under $TESSERA_DATA_DIR
DEFAULT_NODES = data.trace(data.OPENB_NODES)
DEFAULT_JSON = ROOT / "bench" / "results" / "replay.json"
TRACE_LABEL = "tessera.io/trace=openb"


@dataclass
class PodRecord:
    created_at: float | None = None
    bound_at: float | None = None
    node: str | None = None
    phase: str = "Pending"
    reason: str = ""


@dataclass
class Result:
    pods_requested: int
    created: int
    rejected_on_create: int
    bound: int
    unbound: int
    phases: dict[str, int]
    failure_reasons: dict[str, int]
    replay_seconds: float
    bound_per_s: float
    backlog_bound_per_s: float | None
    create_to_bound_p50_ms: float | None
    create_to_bound_p99_ms: float | None
    max_replay_lag_s: float
    cpu_seconds: dict[str, float]
    cpu_seconds_per_pod: dict[str, float | None] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)


# -- the stack ------------------------------------------------------------------------------------------
class Stack:
    def __init__(
        self, state: Path, nodes: Path, speed: float, services: str, env: dict[str, str] | None = None
    ) -> None:
        self.state = state
        state.mkdir(parents=True, exist_ok=True)
        self.log = (state / "up.log").open("w")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")} | (env or {})
        # `tessera up` as its command runs it, but on free ports: the fixed defaults may be taken
        options = (
            f"UpOptions(state_dir=Path({str(state)!r}), services=tuple({services!r}.split(',')), "
            f"cluster_file=Path({str(nodes)!r}), devcluster_speed={speed!r}, ready_timeout=180.0, "
            "use_default_ports=False)"
        )
        code = (
            "import sys; from pathlib import Path; from tessera.cli.up import UpOptions, run_up; "
            f"sys.exit(run_up({options}))"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )

    def wait_ready(self, timeout: float = 240) -> dict[str, Any]:
        path = self.state / "endpoints.json"
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = (self.state / "up.log").read_text()[-3000:]
                raise RuntimeError(f"tessera up did not become ready:\n{tail}")
            time.sleep(0.5)
        endpoints: dict[str, Any] = json.loads(path.read_text())
        return endpoints

    def processes(self) -> dict[str, psutil.Process]:
        """The scheduler's and the devcluster's processes, by name."""
        found: dict[str, psutil.Process] = {}
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            cmdline = " ".join(child.cmdline())
            for name in ("tessera.scheduler", "tessera.devcluster", "tessera.admission", "tessera.telemetry"):
                if f"-m {name}" in cmdline:
                    found[name.split(".")[1]] = child
        return found

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


# -- watching and creating pods -------------------------------------------------------------------------
class PodWatch:
    """Records when each trace pod is bound and how it ends, from a watch on the API server (raw JSON)."""

    def __init__(self, url: str, namespace: str) -> None:
        self.url = url
        self.namespace = namespace
        self.pods: dict[str, PodRecord] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def created(self, name: str) -> None:
        with self.lock:
            self.pods.setdefault(name, PodRecord()).created_at = time.monotonic()

    def _run(self) -> None:
        version = ""
        path = f"{self.url}/api/v1/namespaces/{self.namespace}/pods"
        while not self._stop.is_set():
            params = {"watch": "1", "labelSelector": TRACE_LABEL, "timeoutSeconds": "5"}
            if version:
                params["resourceVersion"] = version
            try:
                with httpx.stream("GET", path, params=params, timeout=30) as response:
                    for line in response.iter_lines():
                        if not line:
                            continue
                        event = json.loads(line)
                        if event.get("type") == "ERROR":  # 410 Expired: list again from now
                            version = ""
                            break
                        version = event["object"]["metadata"]["resourceVersion"]
                        self._seen(event["object"])
            except httpx.HTTPError:
                time.sleep(0.2)

    def _seen(self, pod: dict[str, Any]) -> None:
        now = time.monotonic()
        node = (pod.get("spec") or {}).get("nodeName")
        status = pod.get("status") or {}
        with self.lock:
            record = self.pods.setdefault(pod["metadata"]["name"], PodRecord())
            if node and record.bound_at is None:
                record.bound_at, record.node = now, node
            if status.get("phase"):
                record.phase = status["phase"]
                record.reason = status.get("reason", "")

    def counts(self) -> tuple[int, int]:
        with self.lock:
            bound = sum(1 for r in self.pods.values() if r.bound_at is not None)
            ended = sum(1 for r in self.pods.values() if r.phase in ("Succeeded", "Failed"))
            return bound, ended

    def stop(self) -> None:
        self._stop.set()


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


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


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


def summarise(
    args: argparse.Namespace,
    *,
    trace_size: int,
    report: Any,
    watcher: PodWatch,
    replay_seconds: float,
    cpu: dict[str, float],
) -> Result:
    records = [watcher.pods[n] for n in report.created if n in watcher.pods]
    bound = [r for r in records if r.bound_at is not None and r.created_at is not None]
    latencies = [max(0.0, cast(float, r.bound_at) - cast(float, r.created_at)) * 1000 for r in bound]
    phases: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for r in records:
        phases[r.phase] = phases.get(r.phase, 0) + 1
        if r.phase == "Failed":
            reasons[r.reason or "unknown"] = reasons.get(r.reason or "unknown", 0) + 1
    first = min((cast(float, r.created_at) for r in bound), default=0.0)
    last = max((cast(float, r.bound_at) for r in bound), default=0.0)
    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    return Result(
        pods_requested=trace_size,
        created=len(report.created),
        rejected_on_create=len(report.failed),
        bound=len(bound),
        unbound=len(records) - len(bound),
        phases=dict(sorted(phases.items())),
        failure_reasons=dict(sorted(reasons.items())),
        replay_seconds=round(replay_seconds, 2),
        bound_per_s=round(len(bound) / (last - first), 2) if len(bound) > 1 and last > first else 0.0,
        backlog_bound_per_s=backlog_rate(
            [cast(float, r.created_at) for r in bound], [cast(float, r.bound_at) for r in bound]
        ),
        create_to_bound_p50_ms=round(p50, 1) if p50 is not None else None,
        create_to_bound_p99_ms=round(p99, 1) if p99 is not None else None,
        max_replay_lag_s=round(report.max_lag_s, 3),
        cpu_seconds=cpu,
        cpu_seconds_per_pod=per_pod(cpu, len(report.created)),
        settings={
            "pods": str(args.pods.name),
            "nodes": str(args.nodes.name),
            "skip": args.skip,
            "limit": args.limit,
            "speed": args.speed,
            "rate": args.rate,
            "creators": args.creators,
            "gangs": args.gangs,
            "services": args.services,
            "cpus": os.cpu_count(),
            "command": "python -m bench.replay " + " ".join(sys.argv[1:]),
        },
    )


BACKLOG = 50
"""Pods created and not yet bound above which the scheduler counts as saturated."""


def backlog_rate(created: Sequence[float], bound: Sequence[float], backlog: int = BACKLOG) -> float | None:
    """Pods bound per second while at least ``backlog`` created pods waited: the scheduler's own
    throughput, which ``bound_per_s`` hides when pods are created more slowly than they are bound
    (on a loaded machine the replayer itself can be the limit). None if the backlog never formed."""
    events = sorted([(t, 1) for t in created] + [(t, -1) for t in bound])
    waiting, busy_s, binds, since = 0, 0.0, 0, None
    for t, change in events:
        if since is not None:
            busy_s += t - since
            binds += change < 0
        waiting += change
        since = t if waiting >= backlog else None
    return round(binds / busy_s, 2) if busy_s > 0 and binds else None


def per_pod(cpu: dict[str, float], pods: int) -> dict[str, float | None]:
    """CPU seconds per pod replayed, by process (None where the process was restarted mid-run)."""
    return {
        name: (round(seconds / pods, 5) if pods and seconds == seconds else None)  # NaN: restarted
        for name, seconds in cpu.items()
    }


def print_table(result: Result) -> None:
    rows = [
        ("pods replayed (created / rejected)", f"{result.created} / {result.rejected_on_create}"),
        ("pods bound / never bound", f"{result.bound} / {result.unbound}"),
        ("final phases", ", ".join(f"{k} {v}" for k, v in result.phases.items()) or "-"),
        ("failure reasons", ", ".join(f"{k} {v}" for k, v in result.failure_reasons.items()) or "-"),
        ("replay wall time (s)", f"{result.replay_seconds:.1f}"),
        ("bound pods / s", f"{result.bound_per_s:.2f}"),
        (f"bound pods / s, {BACKLOG}+ waiting", f"{result.backlog_bound_per_s}"),
        ("create -> bound p50 (ms)", f"{result.create_to_bound_p50_ms}"),
        ("create -> bound p99 (ms)", f"{result.create_to_bound_p99_ms}"),
        ("max replay lag (s)", f"{result.max_replay_lag_s:.3f}"),
        *((f"CPU s: {name}", f"{seconds:.1f}") for name, seconds in sorted(result.cpu_seconds.items())),
        *(
            (f"CPU ms per pod: {name}", "-" if seconds is None else f"{seconds * 1000:.1f}")
            for name, seconds in sorted(result.cpu_seconds_per_pod.items())
        ),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"{'metric':<{width}}  value")
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


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
