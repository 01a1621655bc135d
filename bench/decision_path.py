"""The scheduler's decision path alone: the service's gang scheduler and plugins over the openb cluster.

The same slice of the openb pod list that ``bench.replay`` replays (by creation time, ``--skip``,
``--limit``) is submitted as gangs of one, ``--batch`` at a time, to the scheduler the service runs
(framework profile with fragmentation scoring, cache, gang queue), binding to an in-memory port:
no API server, database or bus, so the figures are the decision path's own. Pods never leave.

It runs twice in one process: with node-local verdicts kept per pod shape (the service's setting)
and with every node filtered and scored afresh for every pod, and reports CPU milliseconds per pod
for each, their ratio, and whether the two placed every pod on the same node and GPUs.

Run ``python -m bench.decision_path --help``. Data: Alibaba GPU cluster trace 2023 (openb).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench._openb import DEFAULT_NODES, DEFAULT_PODS, load_nodes
from tessera.devcluster.replay import TraceError, TracePod, load_trace
from tessera.scheduler.domain.cache import SchedulerCache
from tessera.scheduler.domain.framework.pod import PodSpec
from tessera.scheduler.domain.framework.runtime import Framework
from tessera.scheduler.domain.gang.queue import GangQueue
from tessera.scheduler.domain.gang.registry import GangRegistry
from tessera.scheduler.domain.gang.scheduler import GangScheduler
from tessera.scheduler.domain.gang.spec import GangSpec
from tessera.scheduler.domain.placement import OPENB_TYPICAL_WORKLOAD
from tessera.scheduler.domain.plugins.fragmentation import FragmentationScore
from tessera.scheduler.domain.plugins.profiles import build_profile
from tessera.scheduler.domain.plugins.reserve import RecordingBinder
from tessera.scheduler.domain.snapshot import GpuInfo, NodeInfo, Topology


@dataclass
class PathRun:
    name: str
    pods: int
    placed: int
    cpu_seconds: float
    cpu_ms_per_pod: float
    decisions_per_cpu_s: float
    placements_sha256: str


def nodes_of(path: Path) -> list[NodeInfo]:
    return [
        NodeInfo(
            n.name,
            tuple(GpuInfo(i, n.model) for i in range(n.gpu_count)),
            Topology.build(n.gpu_count),
            n.cpu_milli,
            n.memory_mib,
        )
        for n in load_nodes(path)
    ]


def gang_of(pod: TracePod, position: int) -> GangSpec:
    name = f"default/{pod.name}"
    common = {"name": name, "gang": name, "cpu_milli": pod.cpu_milli, "memory_mib": pod.memory_mib}
    models = frozenset(m for m in pod.gpu_spec.split("|") if m)
    if pod.num_gpu == 1 and pod.gpu_milli < 1000:
        spec = PodSpec(gpu_count=1, gpu_milli=pod.gpu_milli, gpu_models=models, **common)  # type: ignore[arg-type]
    elif pod.num_gpu:
        spec = PodSpec(gpu_count=pod.num_gpu, gpu_models=models, **common)  # type: ignore[arg-type]
    else:
        spec = PodSpec(**common)  # type: ignore[arg-type]
    return GangSpec(name, (spec,), 1, 0, float(position), None)


def run_path(
    name: str, nodes: list[NodeInfo], gangs: list[GangSpec], batch: int, max_verdicts: int
) -> PathRun:
    cache = SchedulerCache.rebuild(nodes)
    registry, queue, port = GangRegistry(), GangQueue(), RecordingBinder()
    models = sorted({gpu.model for node in nodes for gpu in node.gpus})
    profile = build_profile(
        cache, registry, port, fragmentation=FragmentationScore(OPENB_TYPICAL_WORKLOAD, models)
    )
    scheduler = GangScheduler(Framework(profile, max_verdicts=max_verdicts), cache, registry, queue, port)
    started = time.process_time()
    for first in range(0, len(gangs), batch):
        for gang in gangs[first : first + batch]:
            scheduler.submit(gang)
        scheduler.run(float(first))
    cpu = time.process_time() - started
    placements = repr([(a.pod, a.node, a.gpu_milli) for a in port.bound]).encode()
    return PathRun(
        name,
        len(gangs),
        len(port.bound),
        round(cpu, 3),
        round(1000 * cpu / len(gangs), 3),
        round(len(gangs) / cpu, 1) if cpu else 0.0,
        hashlib.sha256(placements).hexdigest(),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.decision_path", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--pods", type=Path, default=DEFAULT_PODS, help="openb pod list (default: %(default)s)"
    )
    parser.add_argument(
        "--nodes", type=Path, default=DEFAULT_NODES, help="openb node list (default: %(default)s)"
    )
    parser.add_argument("--skip", type=int, default=2000, help="skip the first N pods (default: 2000)")
    parser.add_argument("--limit", type=int, default=1500, help="pods to place (default: 1500)")
    parser.add_argument(
        "--batch", type=int, default=20, help="gangs submitted per run of the loop (default: 20)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the result here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.limit < 1 or args.batch < 1 or args.skip < 0:
        print("--limit and --batch must be >= 1, --skip >= 0", file=sys.stderr)
        return 2
    try:
        trace = load_trace(args.pods, skip=args.skip, limit=args.limit)
        nodes = nodes_of(args.nodes)
    except (TraceError, ValueError) as exc:
        print(f"input: {exc}", file=sys.stderr)
        return 2
    gangs = [gang_of(pod, i) for i, pod in enumerate(trace)]
    kept = run_path("verdicts kept per shape", nodes, gangs, args.batch, max_verdicts=400_000)
    afresh = run_path("every node afresh", nodes, gangs, args.batch, max_verdicts=0)
    identical = kept.placements_sha256 == afresh.placements_sha256
    print(f"{'path':<26} {'placed':>8} {'CPU ms/pod':>11} {'decisions/CPU s':>16}")
    for run in (kept, afresh):
        print(f"{run.name:<26} {run.placed:>8} {run.cpu_ms_per_pod:>11.2f} {run.decisions_per_cpu_s:>16.1f}")
    ratio = afresh.cpu_seconds / kept.cpu_seconds if kept.cpu_seconds else 0.0
    print(f"afresh / kept CPU: {ratio:.2f}x; placements identical: {identical}")
    if args.json is not None:
        result = {
            "runs": [asdict(kept), asdict(afresh)],
            "cpu_ratio": round(ratio, 2),
            "identical": identical,
        }
        result["settings"] = {
            "pods": args.pods.name,
            "skip": args.skip,
            "limit": args.limit,
            "batch": args.batch,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
