"""B2 — gang scheduling under contention: pod-by-pod placement against all-or-nothing gangs.

A seeded discrete-event simulation. Distributed jobs of 2-16 pods x 1-8 GPUs arrive over time and
together ask for more GPU-hours than the cluster has over the arrival window (150% by default).
Both schedulers are the scheduler's real domain code, assembled from the same plugins:

- baseline: no Coscheduling plugin; every pod is queued and bound on its own, as kube-scheduler
  places pods without a gang plugin. A job runs only once all its pods are bound, so a partially
  placed job holds its GPUs idle. When nothing can make progress any more, the partially placed
  jobs are counted as deadlocked.
- tessera: the default profile with Coscheduling; a job's pods are a gang placed all-or-nothing.

Run ``python -m bench.gang --help``.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tessera.scheduler.domain.framework.builders import make_node, make_pod
from tessera.scheduler.domain.gang.assembly import Assembly, assemble
from tessera.scheduler.domain.gang.queue import BackoffPolicy, QueueOrder
from tessera.scheduler.domain.gang.scheduler import GangOutcome, OutcomeKind
from tessera.scheduler.domain.gang.spec import GangSpec
from tessera.scheduler.domain.plugins.reserve import RecordingBinder
from tessera.scheduler.domain.snapshot import MILLI_PER_GPU, NodeInfo

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "gang.json"
GPUS_PER_POD = (1, 2, 4, 8)
NVLINK_PAIRS = ((0, 1), (2, 3), (4, 5), (6, 7))
NODES_PER_RACK = 8
HOUR = 3600.0

ARRIVAL, POD_CREATED, COMPLETION, WAKEUP = 0, 1, 2, 3


@dataclass(frozen=True)
class Job:
    name: str
    arrival: float
    duration: float
    pods: int
    gpus_per_pod: int
    priority: int

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod


@dataclass
class Metrics:
    scheduler: str
    jobs: int
    completed: int = 0
    deadlocked_jobs: int = 0
    never_started: int = 0
    partial_gang_gpu_hours: float = 0.0
    completed_per_hour: float = 0.0
    mean_jct_h: float = 0.0
    p95_jct_h: float = 0.0
    gpu_utilisation: float = 0.0
    span_h: float = 0.0
    attempts: int = 0
    wall_s: float = 0.0
    jct_s: list[float] = field(default_factory=list, repr=False)


def generate_jobs(seed: int, count: int, total_gpus: int, load: float) -> tuple[list[Job], float]:
    """Jobs with random shapes and log-normal durations (median 1 h), arriving uniformly over a window
    sized so that the GPU-hours asked for are ``load`` times what the cluster offers in it."""
    rng = random.Random(seed)
    shapes = []
    for _ in range(count):
        pods = rng.randint(2, 16)
        gpus = rng.choice(GPUS_PER_POD)
        duration = min(8 * HOUR, max(300.0, rng.lognormvariate(math.log(HOUR), 0.8)))
        priority = 1 if rng.random() < 0.2 else 0
        shapes.append((pods, gpus, duration, priority))
    asked = sum(pods * gpus * duration for pods, gpus, duration, _ in shapes)
    window = asked / (load * total_gpus)
    arrivals = sorted(rng.uniform(0.0, window) for _ in range(count))
    jobs = [
        Job(f"job-{i:04d}", arrival, duration, pods, gpus, priority)
        for i, (arrival, (pods, gpus, duration, priority)) in enumerate(zip(arrivals, shapes, strict=True))
    ]
    return jobs, window


def build_cluster(nodes: int, gpus_per_node: int) -> list[NodeInfo]:
    pairs = tuple(pair for pair in NVLINK_PAIRS if max(pair) < gpus_per_node)
    numa = tuple(0 if i < gpus_per_node // 2 else 1 for i in range(gpus_per_node))
    return [
        make_node(f"node-{i:03d}")
        .gpus(gpus_per_node, model="A100-80GB")
        .nvlink_pairs(*pairs)
        .numa(*numa)
        .rack(f"rack-{i // NODES_PER_RACK}")
        .build()
        for i in range(nodes)
    ]


class Simulation:
    """Replays the jobs through one scheduler and integrates GPU usage between events."""

    def __init__(
        self, jobs: Sequence[Job], nodes: Sequence[NodeInfo], *, gangs: bool, pod_interval_s: float = 0.1
    ) -> None:
        self.jobs = {job.name: job for job in jobs}
        self.gangs = gangs
        # A job controller creates a job's pods one after another, this far apart.
        self.pod_interval_s = pod_interval_s
        # The cluster changes only through events whose requeue hints wake the gangs they concern,
        # so the periodic flush of parked gangs would only repeat identical failures: it is disabled.
        # The baseline's queue orders pods as kube-scheduler's PrioritySort does: a failed pod goes
        # behind the others. Gangs keep their submit time, as in coscheduling.
        self.world: Assembly = assemble(
            nodes,
            RecordingBinder(),
            gangs=gangs,
            backoff=BackoffPolicy(1.0, 10.0),
            max_parked_s=math.inf,
            order=QueueOrder.SUBMITTED if gangs else QueueOrder.LAST_QUEUED,
        )
        self.total_gpus = sum(node.gpu_count for node in nodes)
        self.events: list[tuple[float, int, int, str]] = []
        self.seq = 0
        self.wakeups: set[float] = set()
        self.bound_pods: dict[str, int] = {}
        self.gang_job: dict[str, str] = {}
        self.running: set[str] = set()
        self.done: dict[str, float] = {}
        self.now = 0.0
        self.partial_gpus = 0
        self.running_gpus = 0
        self.busy_gpu_seconds = 0.0
        self.metrics = Metrics("tessera" if gangs else "baseline", len(jobs))

    def run(self) -> Metrics:
        started = time.perf_counter()
        for job in self.jobs.values():
            if self.gangs:
                # The gang is complete, and can be scheduled, once its last pod exists.
                self._push(job.arrival + (job.pods - 1) * self.pod_interval_s, ARRIVAL, job.name)
            else:
                for i in range(job.pods):
                    self._push(job.arrival + i * self.pod_interval_s, POD_CREATED, _pod_name(job, i))
            self.bound_pods[job.name] = 0
        first = min((job.arrival for job in self.jobs.values()), default=0.0)
        while self.events:
            at = self.events[0][0]
            self._advance(at)
            while self.events and self.events[0][0] == at:
                _, _, kind, name = heapq.heappop(self.events)
                self._handle(kind, name)
            outcomes = self.world.scheduler.run(at)
            self.metrics.attempts += len(outcomes)
            for outcome in outcomes:
                self._on_outcome(outcome)
            self._recount()
            wake = self.world.scheduler.next_wakeup()
            if wake is not None and wake > at and wake not in self.wakeups:
                self.wakeups.add(wake)
                self._push(wake, WAKEUP, "")
        # No event is left: nothing runs, nothing arrives, and no pending pod fits. Whatever is
        # partially placed now can never run.
        self.metrics.wall_s = time.perf_counter() - started
        return self._finish(first)

    def _push(self, at: float, kind: int, name: str) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, name))

    def _advance(self, at: float) -> None:
        elapsed = at - self.now
        self.metrics.partial_gang_gpu_hours += elapsed * self.partial_gpus / HOUR
        self.busy_gpu_seconds += elapsed * self.running_gpus
        self.now = at

    def _handle(self, kind: int, name: str) -> None:
        if kind == ARRIVAL:
            job = self.jobs[name]
            pods = tuple(
                make_pod(_pod_name(job, i), job.name, gpus=job.gpus_per_pod) for i in range(job.pods)
            )
            self.gang_job[job.name] = job.name
            self.world.scheduler.submit(GangSpec(job.name, pods, job.pods, job.priority, self.now))
        elif kind == POD_CREATED:
            # Without gangs every pod is its own unit of scheduling, queued when it is created.
            job = self.jobs[name.rsplit("-p", 1)[0]]
            self.gang_job[name] = job.name
            pod = make_pod(name, name, gpus=job.gpus_per_pod)
            self.world.scheduler.submit(GangSpec(name, (pod,), 1, job.priority, self.now))
        elif kind == COMPLETION:
            self.running.discard(name)
            self.done[name] = self.now
            for gang in self._gangs_of(self.jobs[name]):
                self.world.scheduler.gang_finished(gang, self.now)
        else:
            self.wakeups.discard(self.now)

    def _gangs_of(self, job: Job) -> list[str]:
        return [job.name] if self.gangs else [_pod_name(job, i) for i in range(job.pods)]

    def _on_outcome(self, outcome: GangOutcome) -> None:
        if outcome.kind is not OutcomeKind.PLACED:
            return
        job = self.jobs[self.gang_job[outcome.gang]]
        self.bound_pods[job.name] += len(outcome.bound)
        if self.bound_pods[job.name] == job.pods:
            self.running.add(job.name)
            self._push(self.now + job.duration, COMPLETION, job.name)

    def _recount(self) -> None:
        """GPUs of running jobs, and GPUs held by jobs that are placed only in part (from the cache)."""
        held: dict[str, int] = {}
        for allocation in self.world.cache.allocations():
            job = self.gang_job[allocation.gang]
            held[job] = held.get(job, 0) + allocation.gpu_milli_total
        self.running_gpus = sum(milli for job, milli in held.items() if job in self.running) // MILLI_PER_GPU
        self.partial_gpus = (
            sum(milli for job, milli in held.items() if job not in self.running) // MILLI_PER_GPU
        )

    def _finish(self, first: float) -> Metrics:
        m = self.metrics
        m.span_h = (self.now - first) / HOUR
        m.completed = len(self.done)
        m.deadlocked_jobs = sum(1 for job, n in self.bound_pods.items() if 0 < n < self.jobs[job].pods)
        m.never_started = sum(1 for n in self.bound_pods.values() if n == 0)
        m.jct_s = sorted(self.done[job] - self.jobs[job].arrival for job in self.done)
        m.completed_per_hour = m.completed / m.span_h if m.span_h else 0.0
        m.mean_jct_h = sum(m.jct_s) / len(m.jct_s) / HOUR if m.jct_s else 0.0
        m.p95_jct_h = _percentile(m.jct_s, 95) / HOUR
        m.gpu_utilisation = (
            self.busy_gpu_seconds / (self.total_gpus * (self.now - first)) if self.now > first else 0.0
        )
        return m


def _pod_name(job: Job, index: int) -> str:
    return f"{job.name}-p{index:02d}"


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    rank = max(0, math.ceil(q / 100 * len(sorted_values)) - 1)
    return sorted_values[rank]


ROWS = (
    ("GPU-hours held by partial gangs", "partial_gang_gpu_hours", "{:,.1f}"),
    ("deadlocked jobs (partially placed, stuck)", "deadlocked_jobs", "{:d}"),
    ("jobs never started", "never_started", "{:d}"),
    ("completed jobs", "completed", "{:d}"),
    ("completed jobs per hour", "completed_per_hour", "{:.2f}"),
    ("mean job completion time (h)", "mean_jct_h", "{:.2f}"),
    ("p95 job completion time (h)", "p95_jct_h", "{:.2f}"),
    ("average GPU utilisation", "gpu_utilisation", "{:.1%}"),
    ("simulated span (h)", "span_h", "{:.1f}"),
    ("scheduling attempts", "attempts", "{:,d}"),
    ("wall time of the simulation (s)", "wall_s", "{:.1f}"),
)


def render(results: Sequence[Metrics], *, integer_counts: bool = True) -> str:
    width = max(len(label) for label, _, _ in ROWS)
    header = f"{'metric':<{width}}  " + "  ".join(f"{m.scheduler:>12}" for m in results)
    lines = [header, "-" * len(header)]
    for label, attr, fmt in ROWS:
        spec = fmt if integer_counts else fmt.replace(":d}", ":.1f}").replace(":,d}", ":,.1f}")
        cells = "  ".join(f"{spec.format(getattr(m, attr)):>12}" for m in results)
        lines.append(f"{label:<{width}}  {cells}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gang",
        description=(
            "B2: gang scheduling under contention. Simulates distributed jobs (2-16 pods x 1-8 GPUs) "
            "arriving over time on a GPU cluster, once with pod-by-pod placement (no gangs) and once with "
            "Tessera's all-or-nothing gangs, both through the scheduler's real framework and plugins."
        ),
    )
    parser.add_argument("--seed", type=int, default=42, help="random seed of the workload (default 42)")
    parser.add_argument(
        "--seeds", type=int, default=1, help="run this many seeds from --seed and average (default 1)"
    )
    parser.add_argument("--jobs", type=int, default=300, help="number of jobs (default 300)")
    parser.add_argument("--nodes", type=int, default=64, help="nodes in the cluster (default 64)")
    parser.add_argument(
        "--gpus-per-node", type=int, default=8, choices=(2, 4, 8), help="GPUs per node (default 8)"
    )
    parser.add_argument(
        "--load",
        type=float,
        default=1.5,
        help="GPU-hours asked / GPU-hours offered over the arrival window (1.5)",
    )
    parser.add_argument(
        "--pod-interval", type=float, default=0.1, help="seconds between a job's pod creations (default 0.1)"
    )
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, help=f"where to write results (default {DEFAULT_JSON})"
    )
    args = parser.parse_args(argv)
    for name in ("jobs", "nodes", "seeds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: must be >= 1, got {getattr(args, name)}")
    if args.pod_interval < 0:
        parser.error(f"--pod-interval: must be >= 0, got {args.pod_interval}")
    if args.load <= 0:
        parser.error(f"--load: must be > 0, got {args.load}")
    if args.nodes * args.gpus_per_node < 16 * 8:
        parser.error("--nodes: the cluster must hold the largest job (16 pods x 8 GPUs = 128 GPUs)")
    return args


def run_seed(args: argparse.Namespace, seed: int) -> tuple[list[Metrics], dict[str, float]]:
    nodes = build_cluster(args.nodes, args.gpus_per_node)
    jobs, window = generate_jobs(seed, args.jobs, args.nodes * args.gpus_per_node, args.load)
    asked_gpu_h = sum(job.gpus * job.duration for job in jobs) / HOUR
    print(
        f"seed {seed}: {args.jobs} jobs asking {asked_gpu_h:,.0f} GPU-hours over a {window / HOUR:.1f} h "
        f"arrival window ({args.load:.0%} of {args.nodes} nodes x {args.gpus_per_node} GPUs)"
    )
    results = [
        Simulation(jobs, nodes, gangs=gangs, pod_interval_s=args.pod_interval).run()
        for gangs in (False, True)
    ]
    return results, {"arrival_window_h": window / HOUR, "gpu_hours_asked": asked_gpu_h}


def mean_metrics(runs: Sequence[Metrics]) -> Metrics:
    """The mean of each figure over seeds (counts become fractional means)."""
    mean = Metrics(runs[0].scheduler, runs[0].jobs)
    for label_attr in (attr for _, attr, _ in ROWS):
        values = [float(getattr(run, label_attr)) for run in runs]
        setattr(mean, label_attr, sum(values) / len(values))
    return mean


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    per_seed: dict[int, dict[str, object]] = {}
    by_scheduler: dict[str, list[Metrics]] = {"baseline": [], "tessera": []}
    for seed in range(args.seed, args.seed + args.seeds):
        results, workload = run_seed(args, seed)
        if args.seeds > 1:
            print(render(results))
        per_seed[seed] = {
            "workload": workload,
            "results": {m.scheduler: {k: v for k, v in asdict(m).items() if k != "jct_s"} for m in results},
        }
        for m in results:
            by_scheduler[m.scheduler].append(m)
    summary = [mean_metrics(runs) for runs in by_scheduler.values()]
    if args.seeds > 1:
        print(f"mean over {args.seeds} seeds (counts are means too)")
        print(render(summary, integer_counts=False))
    else:
        print(render([runs[0] for runs in by_scheduler.values()]))
    payload = {
        "benchmark": "B2 gang scheduling",
        "command": "python -m bench.gang " + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": {
            "seeds": list(range(args.seed, args.seed + args.seeds)),
            "jobs": args.jobs,
            "nodes": args.nodes,
            "gpus_per_node": args.gpus_per_node,
            "load": args.load,
            "pod_interval_s": args.pod_interval,
        },
        "per_seed": per_seed,
        "mean": {m.scheduler: {k: v for k, v in asdict(m).items() if k != "jct_s"} for m in summary},
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
