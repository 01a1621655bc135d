"""B1: placement quality on the Alibaba openb trace, by the protocol of FGD (USENIX ATC'23).

Every policy replays the same arrival sequences (one per seed) on the same cluster: pods arrive
until their GPU request reaches 130% of capacity and never leave. Reported per policy: the
allocation ratio (GPU milli allocated / capacity) at arrival 100% and 130%, the fragmentation
(FGD's definition, as % of capacity), decisions per second and decision latency. All policies run
the scheduler's own placement code (tessera.scheduler.domain.placement).

    python -m bench.placement --seeds 42-51 --json bench/results/placement.json

`--scale K` replicates the node list K times (names made unique), so the same protocol measures
placement on a cluster K times larger: the arrival sequence fills 130% of the larger capacity.

Data: Alibaba clusterdata, cluster-trace-gpu-v2023 (openb).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench._openb import DEFAULT_NODES, DEFAULT_PODS, VARIANTS, derive_variant, load_nodes, load_pods
from tessera.scheduler.domain.placement import (
    POLICY_FACTORIES,
    ClusterState,
    FragmentationModel,
    NodeSpec,
    PlacementInputError,
    PodShape,
    WorkloadProfile,
    make_policy,
)
from tessera.scheduler.domain.placement.replay import arrival_sequence, ratio_curve, replay

RESULTS = Path(__file__).resolve().parent / "results"
ARRIVAL_POINTS = list(range(131))
# Published 10-seed means of the FGD paper on the default trace: (arrival 100%, arrival 130%).
PUBLISHED = {"Random": (86.30, 87.47), "BestFit": (92.86, 93.08), "FGD": (95.23, 95.39)}
CROSS_CHECK_TOLERANCE = 0.4

POLICIES = POLICY_FACTORIES
DEFAULT_POLICIES = "Random,BestFit,DotProd,FGD,Tessera"


@dataclass
class PolicyRuns:
    """What one policy produced over all seeds of one workload."""

    alloc: list[np.ndarray]  # per seed: allocation ratio (%) at ARRIVAL_POINTS
    frag: list[np.ndarray]  # per seed: fragmentation (% of capacity) at ARRIVAL_POINTS
    seconds: list[np.ndarray]  # per seed: seconds per decision


def parse_seeds(text: str) -> list[int]:
    """'42-51' or '42,43,50' (or a mix) into a list of seeds."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part[1:]:
                lo, hi = part.split("-", 1)
                if int(hi) < int(lo):
                    raise ValueError
                seeds.extend(range(int(lo), int(hi) + 1))
            elif part:
                seeds.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a range like 42-51 or a list like 1,2,3, got {text!r}"
        ) from None
    if not seeds:
        raise argparse.ArgumentTypeError("no seed given")
    return seeds


def parse_policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(unknown) or '(none)'}; choose from {', '.join(POLICIES)}"
        )
    return names


def parse_variants(text: str) -> list[str]:
    names = list(VARIANTS) if text == "all" else [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown {', '.join(unknown)}; choose from all, {', '.join(VARIANTS)}"
        )
    return names


def scale_nodes(nodes: Sequence[NodeSpec], k: int) -> list[NodeSpec]:
    """The node list `k` times over; copy i of a node is named `<name>-x<i>` (the list itself at k=1)."""
    if k < 1:
        raise PlacementInputError(f"scale must be >= 1, got {k}")
    if k == 1:
        return list(nodes)
    return [
        NodeSpec(f"{n.name}-x{i}", n.cpu_milli, n.memory_mib, n.gpu_count, n.model)
        for i in range(k)
        for n in nodes
    ]


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def run_workload(
    label: str,
    nodes: Sequence[NodeSpec],
    pods: list[PodShape],
    policies: list[str],
    seeds: list[int],
    clock: str = "wall",
) -> dict[str, PolicyRuns]:
    """Replay every (policy, seed) on a fresh cluster; progress goes to stderr."""
    profile = WorkloadProfile.from_pods(pods)
    capacity = ClusterState(nodes).gpu_capacity_milli
    sequences = {seed: [pods[i] for i in arrival_sequence(pods, capacity, seed)] for seed in seeds}
    out: dict[str, PolicyRuns] = {}
    for name in policies:
        runs = PolicyRuns([], [], [])
        for seed in seeds:
            state = ClusterState(nodes)
            model = FragmentationModel(profile.typical, state)
            policy = make_policy(name, state, profile, seed)
            started = time.perf_counter()
            result = replay(state, policy, sequences[seed], fragmentation=model, clock=CLOCKS[clock])
            alloc = ratio_curve(
                result.arrived_milli, result.used_milli.astype(float), capacity, ARRIVAL_POINTS
            )
            frag = ratio_curve(result.arrived_milli, result.fragmentation_milli, capacity, ARRIVAL_POINTS)
            runs.alloc.append(alloc)
            runs.frag.append(frag)
            runs.seconds.append(result.decision_seconds)
            print(
                f"[{label}] {name:8s} seed {seed}: {len(sequences[seed])} pods, {result.failed} failed, "
                f"alloc@100 {alloc[100]:.2f}% alloc@130 {alloc[130]:.2f}%, "
                f"{time.perf_counter() - started:.1f}s",
                file=sys.stderr,
                flush=True,
            )
        out[name] = runs
    return out


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "mean": round(float(np.mean(values)), 3),
        "min": round(float(np.min(values)), 3),
        "max": round(float(np.max(values)), 3),
    }


def summarise(runs: dict[str, PolicyRuns]) -> dict[str, dict[str, object]]:
    """The JSON document: per policy, alloc and frag at 100/130 (mean, min, max) and speed."""
    summary: dict[str, dict[str, object]] = {}
    for name, r in runs.items():
        seconds = np.concatenate(r.seconds)
        summary[name] = {
            "alloc_100": _stats([a[100] for a in r.alloc]),
            "alloc_130": _stats([a[130] for a in r.alloc]),
            "frag_100": _stats([f[100] for f in r.frag]),
            "frag_130": _stats([f[130] for f in r.frag]),
            "decisions_per_s": round(float(seconds.size / seconds.sum()), 1),
            "p50_ms": round(float(np.percentile(seconds, 50) * 1e3), 4),
            "p99_ms": round(float(np.percentile(seconds, 99) * 1e3), 4),
            "seeds": len(r.alloc),
            "alloc_curve_mean": [round(float(v), 3) for v in np.mean(r.alloc, axis=0)],
        }
    return summary


def table(summary: dict[str, dict[str, object]]) -> str:
    def cell(s: object) -> str:
        assert isinstance(s, dict)
        return f"{s['mean']:6.2f} ({s['min']:.2f}-{s['max']:.2f})"

    head = (
        f"{'policy':9s} | {'alloc@100 mean (min-max)':24s} | {'alloc@130 mean (min-max)':24s} | "
        f"{'frag@100':8s} | {'frag@130':8s} | {'decisions/s':>11s} | {'p50 ms':>7s} | {'p99 ms':>7s}"
    )
    lines = [head, "-" * len(head)]
    for name, s in summary.items():
        f100, f130 = s["frag_100"], s["frag_130"]
        assert isinstance(f100, dict) and isinstance(f130, dict)
        lines.append(
            f"{name:9s} | {cell(s['alloc_100']):24s} | {cell(s['alloc_130']):24s} | {f100['mean']:8.2f} | "
            f"{f130['mean']:8.2f} | {s['decisions_per_s']:11,.0f} | {s['p50_ms']:7.3f} | {s['p99_ms']:7.3f}"
        )
    return "\n".join(lines)


def cross_check(summary: dict[str, dict[str, object]]) -> list[str]:
    """Differences from the published FGD-paper means; 'FAIL' beyond the tolerance for BestFit and FGD."""
    lines = []
    for name, (pub100, pub130) in PUBLISHED.items():
        if name not in summary:
            continue
        a100, a130 = summary[name]["alloc_100"], summary[name]["alloc_130"]
        assert isinstance(a100, dict) and isinstance(a130, dict)
        d100, d130 = a100["mean"] - pub100, a130["mean"] - pub130
        checked = name in ("BestFit", "FGD")
        ok = abs(d100) <= CROSS_CHECK_TOLERANCE and abs(d130) <= CROSS_CHECK_TOLERANCE
        verdict = ("ok" if ok else "FAIL") if checked else "info only"
        lines.append(
            f"cross-check {name:8s}: @100 {a100['mean']:.2f} vs {pub100:.2f} ({d100:+.2f}), "
            f"@130 {a130['mean']:.2f} vs {pub130:.2f} ({d130:+.2f}) -> {verdict}"
        )
    return lines


def plot(panels: dict[str, dict[str, dict[str, object]]], path: Path) -> None:
    """Allocation ratio vs arrival, one panel per workload, one line per policy (seed mean)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(2, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.8 * rows), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (label, summary) in zip(axes.flat, panels.items(), strict=False):
        ax.plot(ARRIVAL_POINTS, ARRIVAL_POINTS, color="lightgray", linestyle=":", label="arrived")
        for name, s in summary.items():
            curve = s["alloc_curve_mean"]
            assert isinstance(curve, list)
            ax.plot(ARRIVAL_POINTS, curve, label=name)
        ax.set_xlim(0, 130)
        ax.set_ylim(0, 100)
        ax.set_xlabel("GPU request arrived (% of capacity)")
        ax.set_ylabel("GPU allocated (% of capacity)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
        inset = ax.inset_axes((0.5, 0.08, 0.45, 0.4))
        for s in summary.values():
            curve = s["alloc_curve_mean"]
            assert isinstance(curve, list)
            inset.plot(ARRIVAL_POINTS[90:], curve[90:])
        inset.set_title("90-130%", fontsize=8)
        inset.tick_params(labelsize=7)
        ax.legend(loc="upper left", fontsize=8)
    fig.text(
        0.01, 0.01, "Data: Alibaba clusterdata cluster-trace-gpu-v2023 (openb)", fontsize=7, color="gray"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.placement",
        description="B1: allocation ratio of placement policies on an openb-format trace (FGD protocol).",
    )
    parser.add_argument(
        "--nodes", type=Path, default=DEFAULT_NODES, help="node list CSV (default: %(default)s)"
    )
    parser.add_argument("--pods", type=Path, default=DEFAULT_PODS, help="pod list CSV (default: %(default)s)")
    parser.add_argument(
        "--seeds", type=parse_seeds, default=parse_seeds("42-51"), help="e.g. 42-51 or 1,2,3 (default 42-51)"
    )
    parser.add_argument(
        "--policies",
        type=parse_policies,
        default=parse_policies(DEFAULT_POLICIES),
        help=f"comma-separated, from {', '.join(POLICIES)} (default {DEFAULT_POLICIES})",
    )
    parser.add_argument(
        "--variants",
        type=parse_variants,
        default=[],
        help=f"also run synthetic mixes derived from --pods: 'all' or some of {', '.join(VARIANTS)}",
    )
    parser.add_argument(
        "--scale",
        type=int,
        default=1,
        metavar="K",
        help="replicate the node list K times, names made unique (default 1)",
    )
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="time decisions by the wall clock, or by this process's CPU time on a shared machine "
        "(default wall)",
    )
    parser.add_argument(
        "--json", type=Path, help="write the per-policy summary here (variants go to <stem>_variants.json)"
    )
    parser.add_argument(
        "--plot",
        type=Path,
        default=RESULTS / "placement.png",
        help="PNG of allocation vs arrival (default: %(default)s)",
    )
    args = parser.parse_args(argv)

    try:
        nodes = scale_nodes(load_nodes(args.nodes), args.scale)
        pods = load_pods(args.pods)
        workloads = {args.pods.name: pods}
        for variant in args.variants:
            workloads[variant] = derive_variant(pods, nodes, variant)
        panels = {}
        for label, workload in workloads.items():
            panels[label] = summarise(
                run_workload(label, nodes, workload, args.policies, args.seeds, args.clock)
            )
    except PlacementInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    cluster = {"nodes": len(nodes), "gpus": sum(n.gpu_count for n in nodes), "scale": args.scale}
    for summary in panels.values():
        for entry in summary.values():
            entry["cluster"] = cluster
            entry["clock"] = args.clock
    for label, summary in panels.items():
        title = label if label == args.pods.name else f"{label} ({VARIANTS[label]})"
        scaled = f" (node list x{args.scale})" if args.scale > 1 else ""
        print(
            f"\n== {title}: {cluster['nodes']} nodes{scaled}, {cluster['gpus']} GPUs, "
            f"seeds {args.seeds[0]}..{args.seeds[-1]} ({len(args.seeds)}) =="
        )
        print(table(summary))
    if args.pods.resolve() == DEFAULT_PODS.resolve() and args.scale == 1:
        print()
        print("\n".join(cross_check(panels[args.pods.name])))
    plot({args.pods.name: panels[args.pods.name]}, args.plot)
    print(f"\nplot: {args.plot}")
    if args.variants:
        variants_plot = args.plot.with_name(f"{args.plot.stem}_variants.png")
        plot({v: panels[v] for v in args.variants}, variants_plot)
        print(f"plot: {variants_plot}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(panels[args.pods.name], indent=2) + "\n")
        print(f"json: {args.json}")
        if args.variants:
            extra = args.json.with_name(f"{args.json.stem}_variants.json")
            extra.write_text(json.dumps({v: panels[v] for v in args.variants}, indent=2) + "\n")
            print(f"json: {extra}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
