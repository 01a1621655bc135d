"""The trace replayer and the `tessera-devcluster` command line against a running devcluster."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.cluster.cluster_file import NodeSpec
from tessera.devcluster.apiserver import PODS
from tessera.devcluster.cli import main
from tessera.devcluster.replay import Replayer, load_trace
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.devcluster.sim.nvml import DutyCycleTrace

pytestmark = pytest.mark.integration

# Eight consecutive rows of openb_pod_list_default.csv (Alibaba GPU cluster trace 2023), shuffled.
TRACE_SLICE = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
openb-pod-3003,12000,24576,1,1000,,LS,Running,11186555,11188012,11187801
openb-pod-2999,11900,77824,1,1000,,LS,Running,11184401,11187213,11184437
openb-pod-3000,12000,24576,1,1000,,LS,Running,11185236,11195377,11185236
openb-pod-3001,8000,30517,1,650,,BE,Running,11185332,11196712,11185332
openb-pod-3002,12000,24576,1,1000,,LS,Running,11185714,11194955,11187801
openb-pod-3004,15700,58368,1,1000,,LS,Running,11187370,11187466,11187403
openb-pod-3005,16000,65536,1,1000,,LS,Running,11189436,11190163,11189439
openb-pod-3006,15700,58368,1,1000,,LS,Running,11190439,11190533,11190441
"""
SPEED = 10_000.0


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "pods.csv"
    path.write_text(TRACE_SLICE)
    return path


@pytest.fixture
def devcluster(tmp_path: Path) -> Iterator[DevCluster]:
    nodes = [NodeSpec("gpu-0", 96_000, 1_048_576, "A100-80GB", 8, 81920)]
    cluster = DevCluster(nodes, settings=SimSettings(speed=SPEED), duty_cycle=DutyCycleTrace.synthetic())
    cluster.start()
    yield cluster
    cluster.stop()


def test_replay_creates_tessera_pods_by_the_conventions(
    devcluster: DevCluster, trace: Path, tmp_path: Path
) -> None:
    kubeconfig = devcluster.write_kubeconfig(tmp_path / "kubeconfig")

    code = main(["replay", "--pods", str(trace), "--speed", str(SPEED), "--kubeconfig", str(kubeconfig)])

    pods = {p["metadata"]["name"]: p for p in devcluster.store.list(PODS, "default")[0]}
    assert code == 0
    assert sorted(pods) == [f"openb-pod-{n}" for n in range(2999, 3007)]
    assert {p["spec"]["schedulerName"] for p in pods.values()} == {"tessera"}
    shared, whole = pods["openb-pod-3001"], pods["openb-pod-3000"]
    assert shared["metadata"]["annotations"]["tessera.io/gpu-milli"] == "650"
    assert "limits" not in shared["spec"]["containers"][0]["resources"]
    assert whole["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert whole["spec"]["containers"][0]["resources"]["requests"] == {
        "cpu": "12000m",
        "memory": "24576Mi",
        "nvidia.com/gpu": "1",  # defaulted from the limit by the API server
    }
    assert whole["metadata"]["annotations"]["tessera.io/sim-duration"] == str(11195377 - 11185236)


def test_replay_creates_each_pod_no_earlier_than_its_scaled_trace_time(
    devcluster: DevCluster, trace: Path
) -> None:
    pods = load_trace(trace)
    created_at: list[tuple[str, float]] = []
    started = time.monotonic()

    def create(manifest: dict[str, object]) -> None:
        created_at.append((manifest["metadata"]["name"], time.monotonic() - started))  # type: ignore[index]
        devcluster.store.create(PODS, "default", manifest)  # type: ignore[arg-type]

    report = Replayer(create, speed=SPEED).run(pods)

    origin = pods[0].creation_time
    assert [name for name, _ in created_at] == [p.name for p in pods]  # trace order
    for (name, at), pod in zip(created_at, pods, strict=True):
        assert at >= (pod.creation_time - origin) / SPEED, name
    assert report.due_s[-1] == pytest.approx((11190439 - 11184401) / SPEED)


def test_serve_writes_a_kubeconfig_that_kubectl_can_use(kubectl_path: str, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    cluster_file = Path(__file__).parents[4] / "examples" / "clusters" / "dev-4x8.yaml"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tessera.devcluster",
            "serve",
            "--cluster",
            str(cluster_file),
            "--kubeconfig",
            str(kubeconfig),
            "--speed",
            "100",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        banner = server.stdout.readline()
        assert "API server http://127.0.0.1:" in banner and "32 GPUs" in banner
        kubectl = subprocess.run(
            [kubectl_path, "--kubeconfig", str(kubeconfig), "get", "nodes", "-o", "name"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert kubectl.stdout.split() == [f"node/gpu-node-{i}" for i in range(4)], kubectl.stderr
    finally:
        server.terminate()
        assert server.wait(30) == 0


def test_a_bad_cluster_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes:\n  - name: n0\n    gpus: {count: 99, model: A100-80GB}\n")

    code = main(["serve", "--cluster", str(bad)])

    assert code == 2
    assert "nodes[0].gpus.count" in capsys.readouterr().err
