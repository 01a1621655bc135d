"""A one-minute chaos soak (bench.chaos) on a `tessera up` of its own: under steady submissions,
PostgreSQL and then a service are killed with SIGKILL (seed 7 starts with those two) and poison
goes over NATS and HTTP; no accepted job is lost, none is admitted or placed twice, and no poisoned
submission ever runs.

The five-minute soak and its figures are in docs/benchmarks.md; this one keeps CI's time modest.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import chaos

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

ARGS = ["--minutes", "1", "--seed", "7", "--warmup", "10", "--quiet", "15", "--pause", "5", "--drain", "0"]


@pytest.mark.timeout(600)
def test_a_one_minute_soak_loses_and_doubles_nothing(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    chaos.main([*ARGS, "--json", str(out)])
    result = json.loads(out.read_text())
    summary = {k: result[k] for k in ("accepted", "lost", "duplicated", "stuck", "kills", "examples")}

    assert result["accepted"] > 0, summary
    assert result["lost"] == 0, summary
    assert result["duplicated"] == 0, summary
    assert result["kills"]["postgres"] >= 1, result["faults"]
    assert result["unrecovered_faults"] == 0, result["faults"]
    assert result["poison"] >= 1 and result["poison_ran"] == 0, result["poison_by_kind"]
    assert result["tessera_up_exit_code"] == 0
