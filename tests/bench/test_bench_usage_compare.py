"""bench.usage_compare's own parts: the import path of a tree and the medians of alternating runs
(the runs themselves need a git checkout and minutes; bench.usage is tested in test_bench_usage)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import usage_compare


def test_a_trees_import_path_is_the_tree_then_every_members_sources() -> None:
    entries = usage_compare.source_path(usage_compare.ROOT).split(os.pathsep)
    assert entries[0] == str(usage_compare.ROOT)
    assert str(usage_compare.ROOT / "services" / "telemetry" / "src") in entries
    assert str(usage_compare.ROOT / "libs" / "core" / "src") in entries
    assert all(Path(e).is_dir() for e in entries)


def test_the_summary_keeps_every_run_and_their_median() -> None:
    runs = [
        {"samples_per_s": 40_000, "cpu_s": 2.0, "db_server_cpu_s": None},
        {"samples_per_s": 60_000, "cpu_s": 1.0, "db_server_cpu_s": None},
        {"samples_per_s": 50_000, "cpu_s": 1.5, "db_server_cpu_s": None},
    ]
    out = usage_compare.summary(runs)
    assert out["samples_per_s"] == {"runs": [40_000, 60_000, 50_000], "median": 50_000}
    assert out["cpu_s"]["median"] == 1.5
    assert out["db_server_cpu_s"] == {"runs": [], "median": None}  # a remote server: not measured


def test_reps_below_one_are_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        usage_compare.main(["--before", "HEAD", "--reps", "0"])
    assert "--reps must be at least 1" in capsys.readouterr().err
