"""bench.decision_path on a small openb-format trace: both paths place every pod the same way."""

from __future__ import annotations

import json
from pathlib import Path

from bench import decision_path

NODES = (
    "sn,cpu_milli,memory_mib,gpu,model\n"
    "node-a,32000,131072,4,V100M16\n"
    "node-b,64000,262144,8,A100\n"
    "node-c,16000,65536,0,\n"
)
PODS = (  # without gpu_spec or times, as some published pod lists are
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
    + "".join(
        f"pod-{i},{2000 + 500 * (i % 3)},4096,{i % 3},{(250, 1000, 1000)[i % 3] if i % 3 else 0}\n"
        for i in range(24)
    )
)


def test_both_paths_place_every_pod_alike_and_the_result_is_written(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    out = tmp_path / "result.json"
    argv = ["--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv"), "--skip", "0"]
    assert decision_path.main([*argv, "--limit", "24", "--batch", "5", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    kept, afresh = result["runs"]
    assert result["identical"] is True and kept["placements_sha256"] == afresh["placements_sha256"]
    assert kept["pods"] == afresh["pods"] == 24
    assert 0 < kept["placed"] == afresh["placed"] <= 24


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    assert decision_path.main(["--limit", "0"]) == 2
    assert (
        decision_path.main(["--pods", str(tmp_path / "missing.csv"), "--nodes", str(tmp_path / "no.csv")])
        == 2
    )
