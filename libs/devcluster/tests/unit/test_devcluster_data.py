"""The traces shipped in the package: found without anything beside the repository, overridable."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

import tessera.devcluster
from tessera.devcluster import data
from tessera.devcluster.sim.nvml import DutyCycleTrace

HEADERS = {
    data.OPENB_NODES: "sn,cpu_milli,memory_mib,gpu,model",
    data.OPENB_PODS: "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time",
    data.GENAI_DUTY_CYCLE: "value,timestamp_anon,container_ip",
    data.GENAI_QPS: "timestamp_anon,value,container_ip,request_type",
}


@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(data.ENV_VAR, raising=False)


def first_line(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return handle.readline().strip()


@pytest.mark.parametrize("name", list(HEADERS), ids=str)
def test_each_trace_is_in_the_package_with_its_published_columns(name: Path) -> None:
    package = Path(tessera.devcluster.__file__).resolve().parent
    path = data.trace(name)
    assert path.resolve().is_relative_to(package)
    assert first_line(path) == HEADERS[name]


def test_the_traces_carry_their_source_and_citation() -> None:
    readme = (data.bundled_dir() / "README.md").read_text()
    for source in ("cluster-trace-gpu-v2023", "cluster-trace-v2026-GenAI", "USENIX ATC'23"):
        assert source in readme


def test_tessera_data_dir_overrides_the_bundled_traces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(data.ENV_VAR, str(tmp_path))
    assert data.data_dir() == tmp_path
    assert data.trace(data.OPENB_PODS) == tmp_path / "openb" / "openb_pod_list_default.csv"
    # an override without the duty cycle falls back to the synthetic curve, as before
    assert DutyCycleTrace.load().containers == 1


def test_simulated_nvml_replays_the_bundled_genai_duty_cycle_by_default() -> None:
    assert DutyCycleTrace.load().containers == 143
