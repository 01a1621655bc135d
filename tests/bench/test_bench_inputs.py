"""The benchmarks take any trace in the openb format, including pod lists published with fewer
columns, and scale a node list; fixtures are small CSV files written by the tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import placement
from bench._openb import load_nodes, load_pods
from bench.replay import build_parser, per_pod
from tessera.scheduler.domain.placement import NodeSpec, PlacementInputError

NODES = (
    "sn,cpu_milli,memory_mib,gpu,model\n"
    "node-a,32000,131072,4,V100M16\n"
    "node-b,64000,262144,8,A100\n"
    "node-c,16000,65536,0,\n"
)
FGD_PODS = (  # only the columns some published pod lists have
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
    "pod-2,4000,8192,1,500\n"
    "pod-0,8000,16384,2,1000\n"
    "pod-1,2000,4096,0,0\n"
    "pod-3,4000,8192,1,1000\n"
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_pod_list_without_gpu_spec_or_times_means_no_model_constraint(tmp_path: Path) -> None:
    pods = load_pods(write(tmp_path, "pods.csv", FGD_PODS))
    assert [(p.num_gpu, p.gpu_milli) for p in pods] == [(2, 1000), (0, 0), (1, 500), (1, 1000)], "by name"
    assert all(p.gpu_models == frozenset() for p in pods)


def test_gpu_spec_still_constrains_models_when_present(tmp_path: Path) -> None:
    text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\npod-0,1000,1024,1,1000,V100M16|A100\n"
    (pod,) = load_pods(write(tmp_path, "pods.csv", text))
    assert pod.gpu_models == frozenset({"V100M16", "A100"})


def test_a_pod_list_missing_a_required_column_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(PlacementInputError, match="gpu_milli"):
        load_pods(write(tmp_path, "pods.csv", "name,cpu_milli,memory_mib,num_gpu\npod-0,1,1,0\n"))


def test_scaling_replicates_the_nodes_with_unique_names(tmp_path: Path) -> None:
    nodes = load_nodes(write(tmp_path, "nodes.csv", NODES))
    scaled = placement.scale_nodes(nodes, 3)
    assert len(scaled) == 9 and len({n.name for n in scaled}) == 9
    assert sum(n.gpu_count for n in scaled) == 3 * sum(n.gpu_count for n in nodes)
    assert scaled[3] == NodeSpec("node-a-x1", 32000, 131072, 4, "V100M16")
    assert placement.scale_nodes(nodes, 1) == nodes
    with pytest.raises(PlacementInputError):
        placement.scale_nodes(nodes, 0)


def test_the_placement_benchmark_runs_on_an_fgd_pod_list_and_a_scaled_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "placement.json"
    code = placement.main(
        [
            "--nodes",
            str(write(tmp_path, "nodes.csv", NODES)),
            "--pods",
            str(write(tmp_path, "pods.csv", FGD_PODS)),
            "--seeds",
            "1-2",
            "--policies",
            "BestFit,FGD,Tessera",
            "--scale",
            "2",
            "--clock",
            "cpu",
            "--plot",
            str(tmp_path / "placement.png"),
            "--json",
            str(out),
        ]
    )
    assert code == 0
    assert "6 nodes (node list x2), 24 GPUs" in capsys.readouterr().out
    summary = json.loads(out.read_text())
    assert set(summary) == {"BestFit", "FGD", "Tessera"}
    for entry in summary.values():
        assert entry["cluster"] == {"nodes": 6, "gpus": 24, "scale": 2} and entry["clock"] == "cpu"
        assert entry["seeds"] == 2 and entry["decisions_per_s"] > 0
        assert any(0 < a <= 100 for a in entry["alloc_curve_mean"])  # too few pods to land on every x


def test_the_replay_benchmark_takes_a_steady_rate_and_reports_cpu_per_pod() -> None:
    args = build_parser().parse_args(["--rate", "150", "--limit", "3000"])
    assert (args.rate, args.limit) == (150.0, 3000)
    assert build_parser().parse_args([]).rate is None
    assert per_pod({"scheduler": 30.0, "devcluster": float("nan")}, 1000) == {
        "scheduler": 0.03,
        "devcluster": None,
    }
