"""The trace replayer: scaled creation times and pods by Tessera's conventions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tessera.cluster.conventions import parse_pod_requirements
from tessera.cluster.domain.requirements import GpuRequestKind
from tessera.devcluster.replay import Replayer, TraceError, TracePod, load_trace, pod_manifest


def trace_pod(name: str, created: float, num_gpu: int = 1, milli: int = 1000, spec: str = "") -> TracePod:
    return TracePod(name, 4000, 8192, num_gpu, milli, spec, created, duration=60.0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_creation_times_are_divided_by_the_speed() -> None:
    clock = FakeClock()
    created: list[tuple[str, float]] = []
    pods = [trace_pod("c", 1300), trace_pod("a", 1000), trace_pod("b", 1100)]

    def create(manifest: dict[str, Any]) -> None:
        created.append((manifest["metadata"]["name"], clock.now))

    report = Replayer(create, speed=100, clock=clock, sleep=clock.sleep).run(pods)

    assert created == [("a", 0.0), ("b", 1.0), ("c", 3.0)]
    assert report.due_s == [0.0, 1.0, 3.0] and report.max_lag_s == 0.0


def test_a_rejected_pod_is_reported_and_the_replay_goes_on() -> None:
    clock = FakeClock()

    def create(manifest: dict[str, Any]) -> None:
        if manifest["metadata"]["name"] == "bad":
            raise RuntimeError("409 Conflict")

    report = Replayer(create, speed=1, clock=clock, sleep=clock.sleep).run(
        [trace_pod("bad", 0), trace_pod("good", 1)]
    )

    assert report.created == ["good"] and report.failed == [("bad", "409 Conflict")]


@pytest.mark.parametrize(
    ("num_gpu", "milli", "kind", "count", "share"),
    [
        (0, 0, GpuRequestKind.NONE, 0, 0),
        (1, 1000, GpuRequestKind.WHOLE, 1, 1000),
        (8, 1000, GpuRequestKind.WHOLE, 8, 1000),
        (1, 460, GpuRequestKind.FRACTIONAL, 1, 460),
    ],
)
def test_manifests_ask_for_gpus_by_the_conventions(
    num_gpu: int, milli: int, kind: GpuRequestKind, count: int, share: int
) -> None:
    manifest = pod_manifest(trace_pod("p", 0, num_gpu, milli, "V100M16|G2"))

    demand = parse_pod_requirements(manifest["spec"], manifest["metadata"]["annotations"])

    assert manifest["spec"]["schedulerName"] == "tessera"
    assert (demand.gpu.kind, demand.gpu.count, demand.gpu.milli) == (kind, count, share)
    assert demand.cpu_milli == 4000 and demand.memory_mib == 8192
    assert manifest["metadata"]["annotations"]["tessera.io/sim-duration"] == "60"
    if kind is not GpuRequestKind.NONE:
        assert demand.gpu.allowed_models == frozenset({"V100-16GB", "G2"})


def test_speed_must_be_positive() -> None:
    with pytest.raises(ValueError, match="speed"):
        Replayer(lambda m: None, speed=0)


def test_a_steady_rate_paces_pods_in_trace_order_whatever_their_times() -> None:
    clock = FakeClock()
    created: list[tuple[str, float]] = []
    pods = [trace_pod("c", 9000), trace_pod("a", 1000), trace_pod("b", 1001)]

    def create(manifest: dict[str, Any]) -> None:
        created.append((manifest["metadata"]["name"], clock.now))

    Replayer(create, rate=4, clock=clock, sleep=clock.sleep).run(pods)

    assert created == [("a", 0.0), ("b", 0.25), ("c", 0.5)]


def test_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="rate"):
        Replayer(lambda m: None, rate=0)


def test_a_pod_list_with_only_the_fgd_columns_replays_in_file_order_without_model_constraints(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "fgd_pods.csv"
    trace.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        "openb-pod-0002,4000,8192,1,460\n"
        "openb-pod-0000,8000,16384,2,1000\n"
        "openb-pod-0001,1000,2048,0,0\n"
    )

    pods = load_trace(trace)

    assert [p.name for p in pods] == ["openb-pod-0002", "openb-pod-0000", "openb-pod-0001"]
    assert all(p.gpu_spec == "" and p.duration is None for p in pods)
    manifest = pod_manifest(pods[0])
    assert "tessera.io/gpu-models" not in manifest["metadata"]["annotations"]
    demand = parse_pod_requirements(manifest["spec"], manifest["metadata"]["annotations"])
    assert (demand.gpu.kind, demand.gpu.milli) == (GpuRequestKind.FRACTIONAL, 460)
    assert not demand.gpu.allowed_models, "no model constraint"
    assert [p.name for p in load_trace(trace, skip=1, limit=1)] == ["openb-pod-0000"]


def test_a_pod_list_without_a_required_column_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "pods.csv"
    trace.write_text("name,cpu_milli,memory_mib,num_gpu\nopenb-pod-0000,1000,2048,0\n")
    with pytest.raises(TraceError, match="gpu_milli"):
        load_trace(trace)
