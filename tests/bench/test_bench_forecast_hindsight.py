"""bench.forecast_hindsight's bound: exact for one block (the single margin a search would find),
never dearer with finer blocks, within the share of steps allowed short, and a CLI that names bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench._forecast_sim import Simulation
from bench.forecast_hindsight import (
    GRID_POINTS,
    GRID_REPLICAS,
    block_table,
    cheapest,
    hindsight_cost,
    parse_args,
)

T, WARMUP, LAG, HORIZON = 600, 60, 3, 6


def simulation() -> Simulation:
    """A load whose noise is calm in the first half and wild in the second, forecast as its level."""
    rng = np.random.default_rng(7)
    t = np.arange(T)
    level = 10 + 6 * np.sin(t / 50)
    noise = np.where(t < T // 2, 0.3, 2.0) * rng.standard_normal(T)
    y = np.maximum(0.1, level + noise)
    forecasts = np.repeat(level[:, None], HORIZON, axis=1)
    return Simulation(y, WARMUP, LAG, forecasts)


def brute_force_single_margin(sim: Simulation, pct: float) -> float:
    """The fewest replicas over with one margin for the whole run, every margin of the grid tried."""
    margins = np.linspace(0.0, GRID_REPLICAS, GRID_POINTS) * sim.capacity
    feasible = []
    for margin in margins:
        figures = sim.evaluate(sim._replicas(sim.base + margin))
        if figures["under_pct"] <= pct:
            feasible.append(figures["over_replicas"])
    return min(feasible)


def test_one_block_is_the_best_single_margin() -> None:
    sim = simulation()
    bound = hindsight_cost(sim, block=10 * T, pct=5.0)
    assert bound is not None
    assert bound["over_replicas"] == pytest.approx(brute_force_single_margin(sim, 5.0), abs=1e-3)


def test_finer_blocks_are_never_dearer_and_stay_within_the_share_short() -> None:
    sim = simulation()
    costs = []
    for block in (T, 200, 100, 50):  # each nests in the one before
        bound = hindsight_cost(sim, block, pct=5.0)
        assert bound is not None and bound["under_pct"] <= 5.0
        costs.append(bound["over_replicas"])
    assert costs == sorted(costs, reverse=True)
    assert costs[-1] < costs[0]  # the calm half needs less margin than the wild one


def test_the_allocation_is_exact_where_greedy_would_not_be() -> None:
    # two blocks, one step short allowed: block 0 saves 5 by going short, block 1 saves 3
    short = np.array([[0, 1], [0, 1]])
    over = np.array([[5.0, 0.0], [3.0, 0.0]])
    assert cheapest(short, over, allowed=1) == (1, 3.0)
    assert cheapest(short, over, allowed=2) == (2, 0.0)
    assert cheapest(short, over, allowed=0) == (0, 8.0)


def test_the_block_table_counts_every_judged_step_once() -> None:
    sim = simulation()
    short, over = block_table(sim, 100, np.array([0.0, 1e6]))
    judged = T - max(WARMUP, LAG)
    assert over[:, 1].sum() > 0 and short[:, 1].sum() == 0  # a huge margin: never short
    assert short[:, 0].sum() == round(sim.evaluate(sim._replicas(sim.base))["under_pct"] * judged / 100)


def test_bad_input_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--blocks", "60,x"])
    assert "--blocks and --lags take whole numbers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--pct", "120"])
    assert "--pct must lie in [0, 100]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--warmup", "2", "--lags", "3,6"])
    assert "--warmup must be at least the largest lag" in capsys.readouterr().err


def test_the_series_options_are_those_of_bench_forecast(tmp_path: Path) -> None:
    from bench._forecast_series import series_from

    rows = ["t,kind", "0,a", "10,a", "15,b", "70,a", "200,a"]
    (tmp_path / "events.csv").write_text("\n".join(rows) + "\n")
    args = parse_args(
        ["--series", str(tmp_path / "events.csv"), "--time-col", "t", "--count", "--where", "kind=a"]
    )
    assert args.where == {"kind": "a"} and args.count
    path, y, _ = series_from(args, tmp_path / "unused.csv")
    assert path.name == "events.csv" and y.tolist() == [2.0, 1.0, 0.0, 1.0]  # b's row not counted


def test_a_where_without_a_value_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--where", "kind"])
    assert "--where 'kind': expected COL=VALUE" in capsys.readouterr().err


def test_a_bound_the_grid_cannot_reach_is_none_and_a_wider_grid_reaches_it() -> None:
    sim = simulation()
    assert hindsight_cost(sim, block=T, pct=0.0, grid_replicas=0.05) is None
    wide = hindsight_cost(sim, block=T, pct=0.0, grid_replicas=20.0)
    assert wide is not None and wide["under_pct"] == 0.0
    with pytest.raises(SystemExit):
        parse_args(["--grid-replicas", "0"])
