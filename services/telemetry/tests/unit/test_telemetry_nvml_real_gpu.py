"""The NVML source on a machine with an NVIDIA driver: what it reads agrees with `nvidia-smi` and follows a process
that takes GPU memory. On a machine without a driver there is nothing to read, and these tests say so."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import UTC, datetime
from typing import Any

import pytest

from tessera.cluster.catalogue import resolve_product
from tessera.telemetry.adapters.sources.nvml import NvmlSource
from tessera.telemetry.domain.model import SourceUnavailable

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def _no_driver() -> str | None:
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"no NVIDIA driver here ({exc})"
    pynvml.nvmlShutdown()
    return None


WHY_NOT = _no_driver()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")


def _smi() -> list[dict[str, str]]:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not on PATH to compare with")
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid,memory.total,name", "--format=csv,noheader,nounits"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]
    return [{"index": r[0], "uuid": r[1], "memory_total_mib": r[2], "name": r[3]} for r in rows]


async def test_real_nvml_readings_agree_with_nvidia_smi() -> None:
    source = NvmlSource("this-node")
    try:
        readings = await source.read(NOW)
        (node,) = await source.inventory()
    finally:
        await source.close()
    smi = _smi()
    assert [r.gpu_uuid for r in readings] == [g["uuid"] for g in smi]
    assert [r.memory_total_mib for r in readings] == [int(g["memory_total_mib"]) for g in smi]
    for reading in readings:
        assert reading.node == "this-node"
        assert 0.0 <= reading.utilization_pct <= 100.0
        assert 0 <= reading.memory_used_mib <= reading.memory_total_mib
        assert reading.power_w > 0
        assert reading.power_limit_w is None or reading.power_limit_w > 0
        assert 0 < reading.temperature_c < 120
    assert [g.uuid for g in node.gpus] == [g["uuid"] for g in smi]
    for reading, gpu in zip(
        readings, smi, strict=True
    ):  # the driver's product name resolves to a catalogue model
        model = resolve_product(gpu["name"].replace(" ", "-"), reading.memory_total_mib)
        assert model.known, f"{gpu['name']} is not in the catalogue"
        assert reading.model == model.name
    print({r.gpu_uuid: (r.model, r.memory_total_mib, r.power_w) for r in readings})


async def test_real_nvml_sees_this_process_take_gpu_memory() -> None:
    torch: Any = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    source = NvmlSource("this-node")
    try:
        before = (await source.read(NOW))[0]
        block = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda:0")
        block.fill_(1)
        torch.cuda.synchronize()
        after = (await source.read(NOW))[0]
        del block
    finally:
        await source.close()
    assert after.memory_used_mib - before.memory_used_mib >= 1800  # 2 GiB, less what NVML rounds
    # NVML names host PIDs; inside a container without the host's PID namespace they differ from ours
    assert after.pods, "NVML lists no compute process while this one holds 2 GiB"
    assert all(p.startswith("pid/") for p in after.pods)  # no resolver: no pid is named by pod
    processes = after.processes or ()
    assert [f"pid/{p.pid}" for p in processes] == list(after.pods)
    assert all(p.pod is None and p.container is None for p in processes)
    # SM samples where the board keeps them (None where NVML has none), a share of the GPU either way
    assert all(p.sm_pct is None or 0.0 <= p.sm_pct <= 100.0 for p in processes)
    mine = [p for p in processes if p.pid == os.getpid()]  # visible when we share the host's pids
    assert all(p.memory_mib >= 1800 or p.memory_mib == 0 for p in mine), mine  # 0: NVML does not say
    print("this process:", os.getpid(), "NVML:", processes)


async def test_a_closed_source_opens_again() -> None:
    source = NvmlSource("this-node")
    first = await source.read(NOW)
    await source.close()
    try:
        again = await source.read(NOW)
    except SourceUnavailable as exc:  # pragma: no cover - reported, not expected
        pytest.fail(f"NVML did not open a second time: {exc}")
    finally:
        await source.close()
    assert [r.gpu_uuid for r in again] == [r.gpu_uuid for r in first]
