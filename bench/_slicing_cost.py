"""B5 cost view: the GenAI inference pods held exclusively against packed by measured utilisation.

Each pod's duty cycle (`genai/pod_gpu_duty_cycle.csv.gz`) is read onto a one-minute grid (a
reading holds until the next one). Exclusive: one GPU per live pod. Tessera: every
`replan_minutes`, and `react_gap_minutes` after a GPU-minute over 100 %, the live pods are packed
onto time-sliced GPUs by the slicing planner's own `time_slicing.pack_by_usage`: a set of pods fits
a GPU when their summed utilisation over the last `lookback_minutes`, minute by minute, went over
100 % - `headroom_pct` in at most `overload_budget` of those minutes, each minute weighted by its
age with `half_life_minutes`. Minutes a pod has no reading for count as `new_pod_pct` (the
cold-start guess). At most `pods_per_gpu` pods share a GPU, by the stated memory assumption. Pods
stay on their GPU while it still fits them; the moves are counted. A pod that starts between rounds
joins the first GPU with room for the cold-start guess. A GPU-minute is overloaded when its pods'
summed measured utilisation exceeds 100 %.
"""

from __future__ import annotations

import csv
import gzip
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tessera.slicing.domain.time_slicing import pack_by_usage

MINUTE_S = 60.0


@dataclass(frozen=True)
class CostSettings:
    price_per_gpu_hour: float = 4.10  # A100-80GB on demand, examples/prices/aws-us-east-1.yaml
    memory_per_pod_gib: float = 10.0  # assumed: each inference pod fits in 10 GiB
    gpu_memory_gib: float = 80.0
    replan_minutes: int = 60
    lookback_minutes: int = 360
    overload_budget: float = 0.008
    headroom_pct: float = 0.0
    new_pod_pct: float = 50.0
    react_gap_minutes: int = 2
    half_life_minutes: float | None = 30.0
    # Minutes before a pod's first reading count as its own peak so far once it has
    # `min_history_minutes` of readings ("peak"), or as `new_pod_pct` ("guess", as before).
    cold_fill: str = "peak"
    min_history_minutes: int = 10
    # A planner that starts with no history checks again sooner than every `replan_minutes`.
    early_replans: tuple[int, ...] = (10, 20, 30, 45)

    @property
    def pods_per_gpu(self) -> int:
        return max(1, int(self.gpu_memory_gib // self.memory_per_pod_gib))


@dataclass
class Grid:
    names: list[str]
    util: np.ndarray  # pods x minutes, NaN where the pod is not alive
    start_s: float

    @property
    def minutes(self) -> int:
        return int(self.util.shape[1])


def load_grid(path: Path, hours: float | None = None) -> Grid:
    """The trace on a one-minute grid: rows are pods, NaN outside a pod's first and last reading."""
    if not path.is_file():
        raise ValueError(f"{path}: file not found")
    raw: dict[str, list[tuple[float, float]]] = defaultdict(list)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = {"value", "timestamp_anon", "container_ip"} - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
        for line, row in enumerate(reader, start=2):
            try:
                raw[row["container_ip"]].append((float(row["timestamp_anon"]), float(row["value"])))
            except ValueError:
                raise ValueError(f"{path}:{line}: value and timestamp_anon must be numbers") from None
    if not raw:
        raise ValueError(f"{path}: no readings")
    start = min(t for points in raw.values() for t, _ in points)
    end = max(t for points in raw.values() for t, _ in points)
    if hours is not None:
        end = min(end, start + hours * 3600.0)
    minutes = int((end - start) // MINUTE_S) + 1
    names = sorted(raw)
    util = np.full((len(names), minutes), np.nan)
    for position, name in enumerate(names):
        points = sorted(raw[name])
        times = np.array([t for t, _ in points])
        values = np.clip(np.array([v for _, v in points]), 0.0, 100.0)
        grid_times = start + np.arange(minutes) * MINUTE_S
        alive = (grid_times >= times[0]) & (grid_times <= times[-1])
        index = np.searchsorted(times, grid_times, side="right") - 1
        util[position, alive] = values[index[alive]]
    keep = ~np.all(np.isnan(util), axis=1)
    return Grid([n for n, k in zip(names, keep, strict=True) if k], util[keep], start)


@dataclass
class Packing:
    gpu_of: dict[int, int] = field(default_factory=dict)  # pod row -> GPU id
    next_gpu: int = 0
    moves: int = 0


def _size_pct(history: np.ndarray, settings: CostSettings) -> float:
    seen = history[~np.isnan(history)]
    if seen.size == 0:
        return settings.new_pod_pct
    return min(100.0, float(np.max(seen)) + settings.headroom_pct)


def _replan(grid: Grid, minute: int, packing: Packing, settings: CostSettings) -> None:
    alive = [p for p in range(len(grid.names)) if not np.isnan(grid.util[p, minute])]
    # Every pod is judged on the same `lookback_minutes`; minutes it has no reading for (it had not
    # started, or the trace had not) count as the cold-start guess, so a pod earns a tight packing
    # only with history.
    low = minute - settings.lookback_minutes
    window = np.full((len(alive), settings.lookback_minutes), float(settings.new_pod_pct), dtype=float)
    seen = grid.util[alive, max(0, low) : minute]
    if seen.shape[1]:
        fill = np.full(len(alive), float(settings.new_pod_pct))
        if settings.cold_fill == "peak":
            counts = np.sum(~np.isnan(seen), axis=1)
            peaks = np.nanmax(np.where(np.isnan(seen), -1.0, seen), axis=1)
            enough = counts >= settings.min_history_minutes
            fill[enough] = np.minimum(100.0, peaks[enough] + settings.headroom_pct)
        window[:, settings.lookback_minutes - seen.shape[1] :] = np.where(np.isnan(seen), fill[:, None], seen)
        window[:, : settings.lookback_minutes - seen.shape[1]] = fill[:, None]
    histories = window.tolist()
    current = [packing.gpu_of.get(p) for p in alive]
    result = pack_by_usage(
        histories,
        settings.pods_per_gpu,
        overload_budget=settings.overload_budget,
        capacity_pct=100.0 - settings.headroom_pct,
        current=current,
        half_life_minutes=settings.half_life_minutes,
    )
    packing.moves += result.moves
    placed: dict[int, int] = {}
    claimed: set[int] = set()
    for members in result.gpus:
        labels = [label for i in members if (label := current[i]) is not None and label not in claimed]
        if labels:
            gpu = max(set(labels), key=labels.count)
        else:
            gpu = packing.next_gpu
            packing.next_gpu += 1
        claimed.add(gpu)
        for i in members:
            placed[alive[i]] = gpu
    packing.gpu_of = placed


def run_cost(path: Path, settings: CostSettings, hours: float | None = None) -> dict[str, Any]:
    grid = load_grid(path, hours)
    packing = Packing()
    exclusive = np.zeros(grid.minutes, dtype=int)
    tessera = np.zeros(grid.minutes, dtype=int)
    overloaded = 0
    over_series = np.zeros(grid.minutes, dtype=int)
    last_replan = -settings.replan_minutes
    overloaded_before = False
    replans = 0
    for minute in range(grid.minutes):
        alive = ~np.isnan(grid.util[:, minute])
        newcomers = [p for p in np.flatnonzero(alive) if int(p) not in packing.gpu_of]
        due = minute - last_replan >= settings.replan_minutes or minute in settings.early_replans
        # telemetry saw a GPU over 100 % last minute: spread its pods now rather than at the next round
        reacting = overloaded_before and minute - last_replan >= settings.react_gap_minutes
        if due or reacting or newcomers:
            if due or reacting:
                _replan(grid, minute, packing, settings)
                last_replan = minute
                replans += 1
            else:  # a pod that starts between rounds joins at once, sized as new
                for p in newcomers:
                    packing.gpu_of[int(p)] = _first_fit(grid, minute, packing, int(p), settings)
        load: dict[int, float] = defaultdict(float)
        for p in np.flatnonzero(alive):
            load[packing.gpu_of[int(p)]] += float(grid.util[p, minute])
        exclusive[minute] = int(alive.sum())
        tessera[minute] = len(load)
        over_now = sum(1 for total in load.values() if total > 100.0)
        overloaded += over_now
        over_series[minute] = over_now
        overloaded_before = over_now > 0
    # once every pod could have a full window of history (the trace starts with 113 pods at once)
    warm = slice(min(settings.lookback_minutes, grid.minutes), None)
    warm_exclusive = float(exclusive[warm].sum())
    warm_reduction = 100.0 * (1 - float(tessera[warm].sum()) / warm_exclusive) if warm_exclusive else 0.0
    warm_overload = 100.0 * float(over_series[warm].sum()) / max(1, int(tessera[warm].sum()))
    exclusive_h = float(exclusive.sum()) / 60.0
    tessera_h = float(tessera.sum()) / 60.0
    return {
        "pods": len(grid.names),
        "hours": round(grid.minutes / 60.0, 2),
        "mean_utilization_pct": round(float(np.nanmean(grid.util)), 2),
        "exclusive_gpu_hours": round(exclusive_h, 1),
        "tessera_gpu_hours": round(tessera_h, 1),
        "reduction_pct": round(100.0 * (1 - tessera_h / exclusive_h), 1) if exclusive_h else 0.0,
        "overload_minutes_pct": round(100.0 * overloaded / max(1, int(tessera.sum())), 2),
        "after_warmup": {
            "from_minute": settings.lookback_minutes,
            "reduction_pct": round(warm_reduction, 1),
            "overload_minutes_pct": round(warm_overload, 2),
        },
        "peak_gpus_exclusive": int(exclusive.max()),
        "peak_gpus_tessera": int(tessera.max()),
        "pod_moves": packing.moves,
        "pod_moves_per_hour": round(packing.moves / max(1e-9, grid.minutes / 60.0), 1),
        "replans": replans,
        "price_per_gpu_hour": settings.price_per_gpu_hour,
        "exclusive_dollars": round(exclusive_h * settings.price_per_gpu_hour, 2),
        "tessera_dollars": round(tessera_h * settings.price_per_gpu_hour, 2),
        "assumptions": {
            "memory_per_pod_gib": settings.memory_per_pod_gib,
            "gpu_memory_gib": settings.gpu_memory_gib,
            "pods_per_gpu": settings.pods_per_gpu,
            "replan_minutes": settings.replan_minutes,
            "lookback_minutes": settings.lookback_minutes,
            "overload_budget": settings.overload_budget,
            "half_life_minutes": settings.half_life_minutes,
            "headroom_pct": settings.headroom_pct,
            "new_pod_pct": settings.new_pod_pct,
            "react_gap_minutes": settings.react_gap_minutes,
            "cold_fill": settings.cold_fill,
            "min_history_minutes": settings.min_history_minutes,
            "early_replans": list(settings.early_replans),
            "sharing": "time-slicing",
        },
        "series": {
            "exclusive": exclusive.tolist(),
            "tessera": tessera.tolist(),
            "overloaded": over_series.tolist(),
        },
    }


def _first_fit(grid: Grid, minute: int, packing: Packing, pod: int, settings: CostSettings) -> int:
    size = math.ceil(10 * settings.new_pod_pct)
    used: dict[int, int] = defaultdict(int)
    count: dict[int, int] = defaultdict(int)
    low = max(0, minute - settings.lookback_minutes)
    for p, gpu in packing.gpu_of.items():
        if not np.isnan(grid.util[p, minute]):
            used[gpu] += max(1, math.ceil(10 * _size_pct(grid.util[p, low:minute], settings)))
            count[gpu] += 1
    for gpu in sorted(used):
        if used[gpu] + size <= 1000 and count[gpu] < settings.pods_per_gpu:
            return gpu
    packing.next_gpu += 1
    return packing.next_gpu - 1


def plot_cost(path: Path, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    exclusive = result["series"]["exclusive"]
    tessera = result["series"]["tessera"]
    hours = [m / 60.0 for m in range(len(exclusive))]
    fig, ax = plt.subplots(figsize=(10, 4.2))
    ax.plot(
        hours,
        exclusive,
        color="tab:gray",
        lw=1.2,
        label=f"exclusive ({result['exclusive_gpu_hours']:.0f} GPU-h)",
    )
    ax.plot(
        hours,
        tessera,
        color="tab:blue",
        lw=1.2,
        label=f"Tessera time-sliced ({result['tessera_gpu_hours']:.0f} GPU-h)",
    )
    ax.fill_between(hours, tessera, exclusive, color="tab:blue", alpha=0.08)
    if "fluid" in result["series"]:
        ax.plot(
            hours,
            result["series"]["fluid"],
            color="tab:green",
            lw=0.8,
            ls="--",
            label="bound: repacked every minute, no overload",
        )
    ax.set_xlabel("hours into the trace")
    ax.set_ylabel("GPUs needed")
    ax.set_ylim(bottom=0)
    ax.set_title(
        f"{result['pods']} inference pods: {result['reduction_pct']:.0f}% fewer GPU-hours, "
        f"{result['overload_minutes_pct']:.2f}% of GPU-minutes over 100%"
    )
    ax.legend(loc="center right")
    fig.text(
        0.01, 0.01, "data: Alibaba GenAI trace, pod_gpu_duty_cycle (clusterdata)", fontsize=7, color="gray"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
