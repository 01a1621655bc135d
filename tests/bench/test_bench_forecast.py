"""bench.forecast's inputs and policies: event rows counted per step with ISO or epoch times (a step
without one is 0), rows kept by `--where`, the reactive baseline one lag late, the HPA baseline holding its largest
recommendation, and the cost search's answer where no parameter reaches the target."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from bench.forecast import Simulation, load_series, parse_args, parse_time


def test_times_are_epoch_seconds_or_iso_datetimes() -> None:
    assert parse_time("60") == 60.0
    assert parse_time("1970-01-01T00:01:00Z") == 60.0
    assert parse_time("1970-01-01 00:02:00") == 120.0  # naive: UTC
    with pytest.raises(SystemExit, match="neither epoch seconds nor an ISO 8601"):
        parse_time("yesterday")


def test_count_turns_event_rows_into_requests_per_step_and_empty_steps_into_zeros(tmp_path: Path) -> None:
    rows = ["at,route"]
    rows += ["1970-01-01T00:00:10Z,/a"] * 3  # step 0: 3 requests
    rows += ["1970-01-01T00:00:50Z,/b"] * 2  # another second of step 0: 5 requests in all
    rows += ["180,/a"] * 6  # step 3 (epoch seconds), steps 1 and 2 empty
    path = tmp_path / "events.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(rows) + "\n")
    y, filled = load_series(path, "at", None, True, 60.0)
    assert filled == 0  # a step without a row had no request: nothing to fill
    assert y.tolist() == [5.0, 0.0, 0.0, 6.0]  # every row of a step counts, whatever its second


def test_where_keeps_only_the_rows_that_match_and_names_an_unknown_column(tmp_path: Path) -> None:
    path = tmp_path / "qps.csv"
    path.write_text("t,value,kind\n0,4,api\n0,10,gen\n60,6,api\n60,20,gen\n")
    y, _ = load_series(path, "t", "value", False, 60.0, {"kind": "api"})
    assert y.tolist() == [4.0, 6.0]
    y, _ = load_series(path, "t", "value", False, 60.0)
    assert y.tolist() == [14.0, 26.0]
    with pytest.raises(SystemExit, match="--where names no column type"):
        load_series(path, "t", "value", False, 60.0, {"type": "api"})
    assert parse_args(["--where", "kind=API Requests"]).where == {"kind": "API Requests"}
    with pytest.raises(SystemExit):
        parse_args(["--where", "kind"])


def test_the_baselines_react_one_lag_late_and_the_hpa_holds_its_largest_recommendation() -> None:
    y = np.array([10.0] * 10 + [20.0] * 5 + [2.0] * 10)  # peak 20: capacity 1 per replica
    forecasts = np.full((len(y), 6), np.nan)  # no forecast: tessera falls back to the reading
    sim = Simulation(y, warmup=5, lag=3, forecasts=forecasts)
    reactive = sim.reactive(0.0)
    assert reactive[10:13].tolist() == [10, 10, 10] and reactive[13] == 20  # seen at 10, up 3 later
    hpa = sim.hpa(0.0)
    # the last 20 is recommended at 14 and held through 18; replicas follow 3 steps later
    assert hpa[15:23].tolist() == [20] * 7 + [2]
    assert reactive[18] == 2
    assert sim.evaluate(reactive)["under_pct"] == pytest.approx(3 / 20 * 100)
    short_always = lambda h: np.ones(len(y))  # noqa: E731
    assert sim.cost_at(short_always, 5.0, 0.0, 1.0) is None


def test_tessera_calibrates_its_margin_where_the_engine_seeded_it() -> None:
    y = np.array([10.0] * 60)  # peak 10: capacity 0.5 per replica, 20 replicas needed throughout
    forecasts = np.full((len(y), 6), 8.0)  # always 2 short
    plain = Simulation(y, warmup=20, lag=3, forecasts=forecasts)
    seeded = Simulation(y, warmup=20, lag=3, forecasts=forecasts, seeds={19: (2.0,) * 20})
    # seeded, short only on the 2 of 40 steps whose replicas were decided before the warm-up ended;
    # unseeded, also until 10 forecasts have been judged
    assert seeded.evaluate(seeded.tessera(0.9)) == {"under_pct": 5.0, "over_replicas": 0.0}
    assert plain.evaluate(plain.tessera(0.9))["under_pct"] > 30


def test_the_learnt_margin_reactive_covers_a_rise_its_warm_up_has_seen() -> None:
    # load alternates 10 and 20 every 3 steps: 3 steps on, a reading is 10 short half the time
    y = np.array(([10.0] * 3 + [20.0] * 3) * 20)  # peak 20: capacity 1 per replica
    sim = Simulation(y, warmup=30, lag=3, forecasts=np.full((len(y), 6), np.nan))
    learnt = sim.reactive_learnt(0.9)  # learnt over the warm-up: q90 of {-10, +10} is +10
    assert sim.evaluate(learnt)["under_pct"] == 0.0
    assert sim.evaluate(sim.reactive(0.0))["under_pct"] == pytest.approx(50.0)
    held = sim.hpa_learnt(0.9)
    assert (held >= learnt).all()
