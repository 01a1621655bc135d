"""B5's live path runs end to end on a tiny duty-cycle trace: the planner grows a measured node's
replicas and the scheduler fills them by free replicas, past what milli within 1000 allow."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench import slicing_live


def _quiet_trace(path: Path, pods: int = 12, minutes: int = 120) -> Path:
    """Pods at 5 % use: measured, four fit a GPU many times over."""
    lines = ["value,timestamp_anon,container_ip"]
    for pod in range(pods):
        for minute in range(minutes):
            lines.append(f"5.0,{1000.0 + 60 * minute},pod{pod:02d}")
    with gzip.open(path, "wt") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


def test_the_scheduler_fills_the_replicas_the_planner_grew(tmp_path: Path) -> None:
    trace = _quiet_trace(tmp_path / "trace.csv.gz")
    out = tmp_path / "live.json"
    argv = ["--duty-cycle", str(trace), "--at-minute", "60", "--milli", "400", "--gpus", "2", "--ahead", "30"]
    assert slicing_live.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert (result["running"], result["pending"]) == (4, 8)
    replicas = result["replicas_planned"]
    assert replicas > 2 and "by measured use" in result["plan_reason"]
    assert result["by_replicas"]["pods_per_gpu"] == replicas
    assert result["by_replicas"]["max_milli_on_a_gpu"] == 400 * replicas > 1000
    assert result["by_milli_only"]["pods_per_gpu"] == 2, "two shares of 400 milli fit 1000"
    assert result["by_replicas"]["overload_next_hour_pct"] == 0.0
    # uniform GPUs: the former rule (the widest GPU) and the new (the tightest) agree
    assert result["replicas_by_widest_gpu"] == replicas


def test_a_minute_outside_the_trace_is_refused_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _quiet_trace(tmp_path / "trace.csv.gz")
    assert slicing_live.main(["--duty-cycle", str(trace), "--at-minute", "500"]) == 2
    assert "--at-minute: must be within" in capsys.readouterr().err
