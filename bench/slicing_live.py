"""B5 — the live path: slicing's planner grows a busy time-sliced node by measured use, and the
scheduler places the pending shares on it by free replicas (ADR 0021).

    python -m bench.slicing_live --json bench/results/slicing_live.json

One 8-GPU A100 node, time-sliced into 2 replicas by slicing, runs the first pods of the GenAI
duty-cycle trace alive at `--at-minute` (2 a GPU, sized by their measured use over the planner's
window); the other pods alive then are pending shares of `--milli` each (no history: by their
requested milli). The service's own planner (`plan_cluster`) chooses the replicas; the scheduler's
own framework (default profile) then places pending shares until one does not fit, once as it places
now (by free replicas, the node under slicing's config) and once by milli alone (the same replicas
set by hand: milli within 1000, as it placed every time-sliced GPU before), and once by free replicas
under the planner's former rule (replicas from the GPU where the most pending shares fit, every GPU
then taking that many; now the fewest any GPU can take within the budget). The pods' real use over
the next `--ahead` minutes says how often a GPU would have been over 100 %. For scale, the offline
replay's packing (`pack_by_usage`, every pod by its history, no pod kept where it runs) of the pods
alive then that have history.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench._slicing_cost import load_grid
from tessera.cluster.builders import gpu_node
from tessera.cluster.catalogue import model
from tessera.cluster.conventions.names import (
    DEVICE_PLUGIN_CONFIG_LABEL,
    GPU_REPLICAS_LABEL,
    GPU_SHARING_STRATEGY_LABEL,
    SLICING_DEVICE_PLUGIN_CONFIG_PREFIX,
)
from tessera.devcluster import data
from tessera.scheduler.domain.cache import SchedulerCache
from tessera.scheduler.domain.framework.builders import make_pod
from tessera.scheduler.domain.framework.cluster_view import node_info
from tessera.scheduler.domain.framework.cycle_state import CycleState
from tessera.scheduler.domain.framework.runtime import Framework
from tessera.scheduler.domain.gang.registry import GangRegistry
from tessera.scheduler.domain.plugins.filters import GPU_CHOICE
from tessera.scheduler.domain.plugins.profiles import build_profile
from tessera.scheduler.domain.plugins.reserve import RecordingBinder
from tessera.scheduler.domain.snapshot import Allocation
from tessera.slicing.domain.cluster_plan import GpuState, NodeState, PlannerSettings, plan_cluster
from tessera.slicing.domain.demand import PodShape
from tessera.slicing.domain.layout import GpuLayout
from tessera.slicing.domain.time_slicing import PodUse, fit_by_usage, pack_by_usage

NODE = "live-0"
START_REPLICAS = 2


def histories(util: np.ndarray, at: int, settings: PlannerSettings) -> list[tuple[float, ...] | None]:
    """Each pod's use over the planner's window before `at`; minutes without a reading count as its
    peak; None with fewer readings than the planner needs (as `usage_history` does)."""
    window = util[:, max(0, at - settings.usage.lookback_minutes) : at]
    result: list[tuple[float, ...] | None] = []
    for row in window:
        seen = ~np.isnan(row)
        if seen.sum() < settings.usage.min_history_minutes:
            result.append(None)
            continue
        result.append(tuple(np.where(seen, row, np.nanmax(row)).tolist()))
    return result


def schedule(
    replicas: int,
    config: str,
    gpus: int,
    running: Sequence[tuple[str, int]],
    pending: Sequence[str],
    milli: int,
) -> dict[int, list[str]]:
    """Pods per GPU once the scheduler has placed pending shares until one does not fit."""
    labels = {
        GPU_SHARING_STRATEGY_LABEL: "time-slicing",
        GPU_REPLICAS_LABEL: str(replicas),
        DEVICE_PLUGIN_CONFIG_LABEL: config,
    }
    cache = SchedulerCache()
    cache.upsert_node(node_info(gpu_node(NODE, "A100-80GB", gpus, replicas=replicas, labels=labels)))
    on: dict[int, list[str]] = {i: [] for i in range(gpus)}
    for name, gpu in running:
        cache.assume(Allocation(name, name, NODE, ((gpu, milli),)))
        on[gpu].append(name)
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    for name in pending:
        pod = make_pod(name, name, milli=milli)
        state = CycleState()
        if framework.schedule_pod(state, pod, cache.snapshot()).node is None:
            break
        choice = state.read(GPU_CHOICE)[NODE]
        cache.assume(Allocation(name, name, NODE, choice))
        on[choice[0][0]].append(name)
    return on


def overload(
    util: np.ndarray, index: dict[str, int], on: dict[int, list[str]], at: int, minutes: int
) -> float:
    """Share of GPU-minutes over the next `minutes` whose pods' summed use passed 100 %."""
    window = np.nan_to_num(util[:, at : at + minutes])
    over = total = 0
    for pods in on.values():
        if not pods:
            continue
        summed = window[[index[p] for p in pods]].sum(axis=0)
        over += int((summed > 100.0 + 1e-9).sum())
        total += summed.shape[0]
    return 100.0 * over / total if total else 0.0


def run(path: Path, at: int, milli: int, gpus: int, ahead: int) -> dict[str, Any]:
    grid = load_grid(path)
    if not 0 < at < grid.minutes:
        raise ValueError(f"--at-minute: must be within 1..{grid.minutes - 1}, got {at}")
    settings = PlannerSettings()
    alive = [p for p in range(len(grid.names)) if not np.isnan(grid.util[p, at - 1])]
    history = histories(grid.util, at, settings)
    measured = [p for p in alive if history[p] is not None]
    first = measured[: gpus * START_REPLICAS]
    if len(first) < gpus * START_REPLICAS:
        raise ValueError(
            f"--at-minute {at}: only {len(measured)} pods have history, need {gpus * START_REPLICAS}"
        )
    pending = [grid.names[p] for p in alive if p not in first]
    running = [(grid.names[p], i // START_REPLICAS) for i, p in enumerate(first)]
    index = {name: i for i, name in enumerate(grid.names)}
    started = time.process_time()
    node = NodeState(
        NODE,
        tuple(
            GpuState(
                index=g,
                model=model("A100-80GB"),
                layout=GpuLayout.time_slicing(START_REPLICAS),
                running_pods=START_REPLICAS,
                used_milli=START_REPLICAS * milli,
                pods=tuple(PodUse(grid.names[p], milli, history[p]) for p in first[g * 2 : g * 2 + 2]),
            )
            for g in range(gpus)
        ),
        shares_by_replicas=True,
    )
    plan = plan_cluster([node], {PodShape.share(milli): len(pending)}, settings)
    planned = {c.desired.replicas for c in plan.changes if c.changed} or {START_REPLICAS}
    replicas = max(planned)
    planning_cpu = time.process_time() - started
    config = f"{SLICING_DEVICE_PLUGIN_CONFIG_PREFIX}bench"
    now = schedule(replicas, config, gpus, running, pending, milli)
    # the rule before: the node's replicas from the GPU where the most pending shares fit
    widest = max(
        fit_by_usage(
            [g.pods],
            [milli] * len(pending),
            settings.max_replicas,
            settings.usage.overload_budget,
            settings.usage.half_life_minutes,
        ).replicas
        for g in node.gpus
    )
    widest_on = schedule(widest, config, gpus, running, pending, milli)
    before = schedule(replicas, "ts-by-hand", gpus, running, pending, milli)  # milli within 1000
    known = [list(h) for p in alive if (h := history[p]) is not None]
    offline = pack_by_usage(
        known,
        settings.max_replicas,
        overload_budget=settings.usage.overload_budget,
        half_life_minutes=settings.usage.half_life_minutes,
    )

    def figures(on: dict[int, list[str]]) -> dict[str, Any]:
        pods = sum(len(v) for v in on.values())
        return {
            "pods": pods,
            "pods_per_gpu": round(pods / gpus, 2),
            "max_milli_on_a_gpu": max(len(v) for v in on.values()) * milli,
            "overload_next_hour_pct": round(overload(grid.util, index, on, at, ahead), 2),
        }

    return {
        "at_minute": at,
        "milli": milli,
        "gpus": gpus,
        "alive": len(alive),
        "running": len(running),
        "pending": len(pending),
        "replicas_planned": replicas,
        "plan_reason": plan.changes[0].reason if plan.changes else None,
        "planning_cpu_s": round(planning_cpu, 3),
        "by_replicas": figures(now),
        "replicas_by_widest_gpu": widest,
        "by_replicas_widest_gpu": figures(widest_on),
        "by_milli_only": figures(before),
        "offline_pods_with_history": len(known),
        "offline_pods_per_gpu": round(len(known) / max(1, len(offline.gpus)), 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duty-cycle", type=Path, default=data.trace(data.GENAI_DUTY_CYCLE))
    parser.add_argument("--at-minute", type=int, default=1100, help="when the planner runs (trace minute)")
    parser.add_argument("--milli", type=int, default=300, help="requested milli of every pod")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs of the time-sliced node")
    parser.add_argument("--ahead", type=int, default=60, help="minutes of real use the overload is read over")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    try:
        result = run(args.duty_cycle, args.at_minute, args.milli, args.gpus, args.ahead)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
