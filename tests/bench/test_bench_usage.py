"""B7 on a short slice of the bundled GenAI trace, flushed to the session's real PostgreSQL as the
telemetry service flushes: the JSON has the fields docs/benchmarks.md reports, the accounting read
back from the database agrees with the trace, rows were stored, and replaying the last hour (into the
same ledger, and into one restored from the stored rows) changes no stored row. No timings are checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import usage
from tessera.testing.infra import DatabaseServerHandle

pytestmark = pytest.mark.integration

FIELDS = {
    "samples",
    "rounds",
    "error_pct",
    "allocated_error_pct",
    "flushes",
    "rows_written",
    "stored_rows",
    "replay_idempotent",
    "replayed_duplicates",
    "restart_restored_rows",
    "samples_per_s",
    "cpu_pct_per_1000_gpus",
    "domain_samples_per_s",
    "domain_cpu_pct_per_1000_gpus",
    "flush_cpu_s",
    "db_server_cpu_s",
    "goals",
}


def test_bench_usage_slice_is_stored_accurately_and_replays_idempotently(
    postgres_server: DatabaseServerHandle, tmp_path: Path
) -> None:
    out = tmp_path / "usage.json"
    # an hour and a half: the first hour is closed and dropped from memory, so what is checked was read back
    report = tmp_path / "report"
    usage.main(
        ["--hours", "1.5", "--database-url", postgres_server.url, "--json", str(out), "--report", str(report)]
    )
    result = json.loads(out.read_text())
    # the report: the table `tessera usage` prints, saved as text, and its chart
    table = (report / "usage-by-tenant.txt").read_text()
    assert "GPU usage by tenant" in table and "total:" in table
    assert (report / "usage-by-tenant.png").stat().st_size > 0

    assert result.keys() >= FIELDS
    assert result["rounds"] == 540
    assert result["samples"] == result["rounds"] * result["gpus"]
    assert abs(result["error_pct"]) < 0.5
    assert abs(result["allocated_error_pct"]) < 0.5
    # the sampler's cadence: a flush every 30 simulated seconds, and one when it stops
    assert result["flushes"] == pytest.approx(result["rounds"] * usage.INTERVAL_S / usage.FLUSH_S, abs=2)
    stored = result["stored_rows"]
    assert stored["usage_hourly"] > result["containers"]  # two clock hours, a row per container and hour
    assert stored["usage_daily"] > 0
    assert result["rows_written"] >= stored["usage_hourly"]
    assert result["replay_idempotent"] is True
    assert result["replayed_duplicates"] > 0
    assert result["restart_restored_rows"] > 0
    assert result["restart_replay_duplicates"] + result["restart_replay_late"] > 0
    assert result["cpu_s"] == pytest.approx(result["domain_cpu_s"] + result["flush_cpu_s"], abs=0.01)
    assert result["flush_cpu_s"] > 0
    assert set(result["goals"]) == {
        "error_within_0_5_pct",
        "samples_per_s_at_least_50000",
        "cpu_under_5_pct_per_1000_gpus",
    }
