"""B5 runs end to end on tiny inputs and writes the JSON shape docs/benchmarks.md describes; the
figures obey their invariants (no timings are checked)."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

from bench import slicing
from bench._slicing_cost import CostSettings, run_cost

NODES = "sn,cpu_milli,memory_mib,gpu,model\nnode-a,64000,262144,8,A100\nnode-b,32000,131072,4,V100M16\n"
PODS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
    "pod-0,4000,8192,1,500\n"
    "pod-1,2000,4096,1,250\n"
    "pod-2,8000,16384,2,1000\n"
    "pod-3,1000,2048,1,810\n"
    "pod-4,1000,2048,0,0\n"
)


def _duty_cycle(path: Path, pods: int = 6, minutes: int = 150) -> Path:
    rng = random.Random(1)
    lines = ["value,timestamp_anon,container_ip"]
    for pod in range(pods):
        start = 0 if pod < 4 else 40  # two pods start late, with no history
        for minute in range(start, minutes):
            value = rng.choice([0.0, 0.0, 3.0, 8.0, 30.0])
            lines.append(f"{value},{1000.0 + 60 * minute},pod{pod}")
    with gzip.open(path, "wt") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


def test_b5_writes_its_three_parts(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES)
    pods = tmp_path / "pods.csv"
    pods.write_text(PODS)
    out = tmp_path / "b5.json"
    plot = tmp_path / "cost.png"
    argv = [
        *("--nodes", str(nodes), "--pods", str(pods), "--seeds", "1,2"),
        *("--duty-cycle", str(_duty_cycle(tmp_path / "duty.csv.gz"))),
        *("--cases", "5", "--cluster-nodes", "1,2", "--cluster-seeds", "1", "--no-tradeoffs"),
        *("--json", str(out), "--plot", str(plot)),
    ]
    assert slicing.main(argv) == 0
    body = json.loads(out.read_text())
    assert set(body) == {"fractional", "mig", "cost"}

    fractional = body["fractional"]
    for run in fractional["runs"]:
        assert run["lower_bound"] <= run["l2_bound"] <= run["gpus_used"]
        assert run["ratio"] >= 1.0 and run["replicas"] >= 2

    mig = body["mig"]
    assert mig["cases"] == 10 and 0 <= mig["optimal_cases"] <= mig["cases"]
    assert mig["optimal_cases"] == mig["cases"]  # the planner is exact
    for single in mig["single_gpu"]:
        assert single["geometries"] == single["exhaustive_geometries"]
    for row in mig["cluster"]:
        assert row["gpus"] >= row["lower_bound"] and row["ratio"] >= 1.0
        assert row["pods_placeable"] <= row["pods"]

    cost = body["cost"]
    assert cost["pods"] == 6
    assert 0 < cost["tessera_gpu_hours"] <= cost["exclusive_gpu_hours"]
    assert 0 <= cost["overload_minutes_pct"] <= 100
    expected = round(100 * (1 - cost["tessera_gpu_hours"] / cost["exclusive_gpu_hours"]), 1)
    assert abs(cost["reduction_pct"] - expected) <= 1.0  # the hours are rounded to 0.1
    assert cost["reduction_pct"] <= cost["fluid_reduction_pct"]
    assert abs(cost["exclusive_dollars"] - cost["exclusive_gpu_hours"] * cost["price_per_gpu_hour"]) < 0.5
    assert cost["assumptions"]["pods_per_gpu"] == 8
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_cost_view_never_puts_more_pods_on_a_gpu_than_memory_allows(tmp_path: Path) -> None:
    path = _duty_cycle(tmp_path / "duty.csv.gz", pods=10, minutes=120)
    tight = run_cost(path, CostSettings(memory_per_pod_gib=40.0))  # two pods a GPU at most
    series = tight["series"]
    alive = series["exclusive"]
    assert all(t >= -(-a // 2) for t, a in zip(series["tessera"], alive, strict=True))
    assert tight["tessera_gpu_hours"] >= tight["exclusive_gpu_hours"] / 2 - 0.1


def _optimal_bins(sizes: list[int], capacity: int = 1000) -> int:
    """The fewest bins by exhaustive search (each item into an open bin or a new one)."""
    best = len(sizes)

    def place(i: int, loads: list[int]) -> None:
        nonlocal best
        if len(loads) >= best:
            return
        if i == len(sizes):
            best = len(loads)
            return
        for b in range(len(loads)):
            if loads[b] + sizes[i] <= capacity:
                loads[b] += sizes[i]
                place(i + 1, loads)
                loads[b] -= sizes[i]
        loads.append(sizes[i])
        place(i + 1, loads)
        loads.pop()

    place(0, [])
    return best


def test_the_l2_bound_is_a_lower_bound_and_beats_the_sum_bound_where_it_should() -> None:
    # no two shares over 500 milli fit one GPU, which ceil(sum / 1000) ignores
    assert slicing.martello_toth_bound([600, 600, 600]) == 3
    assert slicing.martello_toth_bound([810] * 4 + [190] * 4) == 4
    assert slicing.martello_toth_bound([810] * 4 + [200] * 4) == 5  # the 200s cannot ride with an 810
    assert slicing.martello_toth_bound([250] * 8) == 2  # only small shares: the sum bound
    rng = random.Random(7)
    tighter = 0
    for _ in range(300):
        sizes = [
            rng.choice([100, 190, 250, 300, 450, 500, 510, 650, 810, 1000]) for _ in range(rng.randint(1, 8))
        ]
        naive = -(-sum(sizes) // 1000)
        bound = slicing.martello_toth_bound(sizes)
        optimal = _optimal_bins(sorted(sizes, reverse=True))
        assert naive <= bound <= optimal, sizes
        tighter += bound > naive
    assert tighter > 0  # the cases include some where L2 is the stronger bound


def test_the_cost_view_decides_from_past_readings_only(tmp_path: Path) -> None:
    path = _duty_cycle(tmp_path / "duty.csv.gz", pods=8, minutes=150)
    with gzip.open(path, "rt") as handle:
        lines = handle.read().splitlines()
    cut = 1000.0 + 60 * 90  # from minute 90 on, every pod runs flat out
    changed = [lines[0]] + [
        f"100.0,{t},{ip}" if float(t) >= cut else f"{v},{t},{ip}"
        for v, t, ip in (line.split(",") for line in lines[1:])
    ]
    future = tmp_path / "future.csv.gz"
    with gzip.open(future, "wt") as handle:
        handle.write("\n".join(changed) + "\n")
    before = run_cost(path, CostSettings())["series"]["tessera"]
    after = run_cost(future, CostSettings())["series"]["tessera"]
    assert before[:91] == after[:91]  # the packing at minute 90 saw readings up to minute 89
    assert before[91:] != after[91:]  # and the readings it then saw did change it
