"""The reading sources: dcgm-exporter's exposition format, NVML through a fake pynvml, the devcluster."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tessera.telemetry.adapters.sources.dcgm import DcgmExporterSource, readings_from_exposition
from tessera.telemetry.adapters.sources.devcluster import DevclusterSource, reading_from_json
from tessera.telemetry.adapters.sources.nvml import NvmlSource
from tessera.telemetry.domain.health import BecameUnhealthy, Fault, HealthTracker
from tessera.telemetry.domain.idle import IdlePolicy, IdleTracker
from tessera.telemetry.domain.model import SourceUnavailable

NOW = datetime(2026, 11, 21, 6, 0, tzinfo=UTC)
DCGM_SAMPLE = Path(__file__).with_name("data") / "dcgm-exporter-a100x2.prom"


# -- dcgm-exporter -------------------------------------------------------------------------------------
def test_dcgm_exposition_maps_each_gpu() -> None:
    first, second = readings_from_exposition(DCGM_SAMPLE.read_text(), NOW)
    assert (first.node, first.gpu_index, first.gpu_uuid) == (
        "gpu-node-7",
        0,
        "GPU-5f3b2c1e-8a4d-4e0b-9c6f-2d7a1b3e4f50",
    )
    assert (first.utilization_pct, first.memory_used_mib, first.memory_total_mib) == (87.0, 68376, 80920)
    assert (first.power_w, first.temperature_c, first.model) == (312.456, 67.0, "A100-80GB")
    assert first.pods == ("ml-research/training-7f9c-worker-0",) and first.xid_errors == ()
    assert second.pods == () and second.xid_errors == (79,)


def test_dcgm_xid_makes_the_gpu_unhealthy() -> None:
    tracker = HealthTracker()
    findings = [tracker.inspect(r) for r in readings_from_exposition(DCGM_SAMPLE.read_text(), NOW)]
    assert [set(f.faults) for f in findings] == [set(), {Fault.XID}]


def test_dcgm_node_name_overrides_the_hostname_label_and_no_pod_labels_means_unknown() -> None:
    text = (
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-x",device="nvidia0",modelName="Tesla T4",Hostname="pod-abc"} 5\n'
        "# TYPE DCGM_FI_DEV_ROW_REMAP_FAILURE gauge\n"
        'DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu="0",UUID="GPU-x",device="nvidia0",modelName="Tesla T4",Hostname="pod-abc"} 1\n'
    )
    (reading,) = readings_from_exposition(text, NOW, node="gpu-node-1")
    assert reading.node == "gpu-node-1" and reading.model == "T4"
    assert reading.pods is None and reading.ecc_uncorrected == 1


def test_dcgm_mig_instances_fold_into_their_gpu() -> None:
    labels = 'gpu="0",UUID="GPU-m",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="n"'
    text = "\n".join(
        [
            "# TYPE DCGM_FI_DEV_FB_USED gauge",
            f'DCGM_FI_DEV_FB_USED{{{labels},GPU_I_PROFILE="3g.40gb",GPU_I_ID="1"}} 1000',
            f'DCGM_FI_DEV_FB_USED{{{labels},GPU_I_PROFILE="3g.40gb",GPU_I_ID="2"}} 3000',
            "# TYPE DCGM_FI_DEV_GPU_TEMP gauge",
            f'DCGM_FI_DEV_GPU_TEMP{{{labels},GPU_I_PROFILE="3g.40gb",GPU_I_ID="1"}} 55',
            f'DCGM_FI_DEV_GPU_TEMP{{{labels},GPU_I_PROFILE="3g.40gb",GPU_I_ID="2"}} 61',
            "",
        ]
    )
    (reading,) = readings_from_exposition(text, NOW)
    assert (reading.memory_used_mib, reading.temperature_c) == (4000, 61.0)


def test_dcgm_nan_or_inf_counts_as_missing_and_the_rest_of_the_node_is_read() -> None:
    """dcgm-exporter writes NaN (or +Inf) where DCGM has no value for a field."""

    def line(metric: str, gpu: int, value: str) -> str:
        return f'{metric}{{gpu="{gpu}",UUID="GPU-{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} {value}'

    text = "\n".join(
        [
            line("DCGM_FI_DEV_GPU_UTIL", 0, "50"),
            line("DCGM_FI_DEV_FB_USED", 0, "100"),
            line("DCGM_FI_DEV_FB_FREE", 0, "81459"),
            line("DCGM_FI_DEV_GPU_UTIL", 1, "NaN"),
            line("DCGM_FI_DEV_FB_USED", 1, "NaN"),
            line("DCGM_FI_DEV_FB_FREE", 1, "+Inf"),
            line("DCGM_FI_DEV_POWER_USAGE", 1, "-Inf"),
            line("DCGM_FI_DEV_GPU_TEMP", 1, "41"),
            line("DCGM_FI_DEV_XID_ERRORS", 1, "NaN"),
            line("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1, "+Inf"),
            line("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1, "1"),
            line("DCGM_FI_DEV_POWER_MGMT_LIMIT", 1, "NaN"),
            "",
        ]
    )
    first, second = readings_from_exposition(text, NOW)
    assert (first.gpu_uuid, first.utilization_pct, first.memory_used_mib, first.memory_total_mib) == (
        "GPU-0",
        50.0,
        100,
        81559,
    )
    assert (second.gpu_uuid, second.utilization_pct, second.memory_used_mib, second.memory_total_mib) == (
        "GPU-1",
        0.0,
        0,
        0,
    )
    assert (second.power_w, second.temperature_c, second.power_limit_w) == (0.0, 41.0, None)
    assert (second.xid_errors, second.ecc_uncorrected, second.model) == ((), 1, "H100-80GB")
    assert first.utilization_known and not second.utilization_known  # NaN: unknown, not 0%


def test_dcgm_gpu_whose_utilisation_is_nan_or_missing_is_never_flagged_idle() -> None:
    """A held GPU whose utilisation dcgm-exporter writes as NaN (or does not export) is not read as
    0% busy: ten minutes of such readings do not make it idle."""
    labels = 'gpu="0",UUID="GPU-0",modelName="NVIDIA H100 80GB HBM3",Hostname="n1",namespace="ns",pod="p"'
    for utilisation in (f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} NaN\n", ""):
        text = f"{utilisation}DCGM_FI_DEV_FB_USED{{{labels}}} 100\n"
        tracker = IdleTracker(IdlePolicy(idle_after_s=600))
        changes = [
            tracker.observe(reading)
            for t in range(0, 1200, 60)
            for reading in readings_from_exposition(text, NOW + timedelta(seconds=t))
        ]
        assert len(changes) == 20 and changes == [None] * 20, utilisation
        assert tracker.idle() == set()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('DCGM_FI_DEV_GPU_UTIL{gpu="zero",UUID="GPU-x"} 5\n', "gpu='zero' is not an index"),
        ("DCGM_FI_DEV_GPU_UTIL{gpu=0} 5\n", "not the Prometheus text format"),
    ],
)
def test_bad_dcgm_output_names_the_problem(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        readings_from_exposition(text, NOW)


async def test_dcgm_source_scrapes_over_http_and_reports_a_dead_exporter() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=DCGM_SAMPLE.read_text())
        return httpx.Response(503)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    source = DcgmExporterSource("http://exporter:9400/metrics", client=client)
    assert [r.gpu_index for r in await source.read(NOW)] == [0, 1]
    (node,) = await source.inventory()
    assert node.name == "gpu-node-7" and [g.memory_mib for g in node.gpus] == [80920, 80995]
    down = DcgmExporterSource("http://exporter:9400/down", client=client)
    with pytest.raises(SourceUnavailable, match="HTTP 503"):
        await down.read(NOW)


# -- devcluster ----------------------------------------------------------------------------------------
DEVCLUSTER_READING = {
    "node": "gpu-node-0",
    "index": 3,
    "uuid": "GPU-abc",
    "model": "A100-80GB",
    "health": "unhealthy",
    "utilisation_pct": 93.5,
    "memory_used_mib": 69632,
    "memory_total_mib": 81920,
    "power_w": 378.0,
    "temperature_c": 72.1,
    "xid_errors": [79],
    "throttled": False,
    "pods": ["default/train-0"],
    "sampled_at_s": 12.5,
}


def test_devcluster_reading_maps_every_field() -> None:
    r = reading_from_json(DEVCLUSTER_READING, NOW)
    assert (r.node, r.gpu_index, r.gpu_uuid, r.at) == ("gpu-node-0", 3, "GPU-abc", NOW)
    assert (r.utilization_pct, r.memory_used_mib, r.memory_total_mib) == (93.5, 69632, 81920)
    assert (r.power_w, r.temperature_c, r.xid_errors, r.pods, r.lost) == (
        378.0,
        72.1,
        (79,),
        ("default/train-0",),
        False,
    )
    assert reading_from_json({**DEVCLUSTER_READING, "health": "lost"}, NOW).lost


def test_devcluster_reading_without_a_field_names_it() -> None:
    body = {k: v for k, v in DEVCLUSTER_READING.items() if k != "uuid"}
    with pytest.raises(ValueError, match="'uuid'"):
        reading_from_json(body, NOW)


async def test_devcluster_source_reads_every_node() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/nvml":
            return httpx.Response(200, json={"nodes": ["a", "b"]})
        node = request.url.path.rsplit("/", 1)[1]
        body = {"node": node, "readings": [{**DEVCLUSTER_READING, "node": node}]}
        return httpx.Response(200, content=json.dumps(body))

    source = DevclusterSource(
        "http://dev:6443/", client=httpx.AsyncClient(transport=httpx.MockTransport(handler))
    )
    assert [r.node for r in await source.read(NOW)] == ["a", "b"]
    assert source.name == "devcluster:http://dev:6443"


# -- NVML, through a fake pynvml -----------------------------------------------------------------------
class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


def fake_pynvml(*, library: bool = True, xids: list[tuple[int, int]] | None = None, gpus: int = 2) -> Any:
    """A stand-in for the pynvml module with A100s: GPU 1 is hot and has an uncorrected ECC error.

    `broken` maps a GPU index to the NVML error every call about that GPU raises from then on (15:
    GPU_IS_LOST, the GPU fell off the bus), handle lookups included."""
    handles = [SimpleNamespace(index=i) for i in range(gpus)]
    pending = list(xids or [])
    calls: list[str] = []
    broken: dict[int, int] = {}

    def device(call: Any) -> Any:
        def checked(handle: Any, *args: Any) -> Any:
            index = handle if isinstance(handle, int) else handle.index
            if index in broken:
                raise FakeNvmlError(broken[index])
            return call(handle, *args)

        return checked

    def init() -> None:
        calls.append("init")
        if not library:
            raise FakeNvmlError(12)

    def wait(_events: object, timeout_ms: int) -> Any:
        if not pending:
            raise FakeNvmlError(10)
        index, xid = pending.pop(0)
        # pynvml hands back a new handle object for the event's device, as here
        return SimpleNamespace(device=SimpleNamespace(index=index), eventData=xid)

    def ecc(handle: Any, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (1, 0)
        return 3 if handle.index == 1 else 0

    return SimpleNamespace(
        NVMLError=FakeNvmlError,
        NVML_ERROR_LIBRARY_NOT_FOUND=12,
        NVML_ERROR_GPU_IS_LOST=15,
        NVML_TEMPERATURE_GPU=0,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0,
        nvmlEventTypeXidCriticalError=8,
        calls=calls,
        broken=broken,
        pending=pending,
        nvmlInit=init,
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: gpus,
        nvmlDeviceGetHandleByIndex=device(lambda i: handles[i]),
        nvmlEventSetCreate=lambda: "events",
        nvmlEventSetFree=lambda events: calls.append("free"),
        nvmlDeviceRegisterEvents=device(lambda handle, kinds, events: None),
        nvmlEventSetWait_v2=wait,
        nvmlDeviceGetIndex=device(lambda handle: handle.index),
        nvmlDeviceGetUUID=device(lambda h: f"GPU-fake-{h.index}"),
        nvmlDeviceGetName=device(lambda h: b"NVIDIA A100-SXM4-80GB"),
        nvmlDeviceGetMemoryInfo=device(
            lambda h: SimpleNamespace(total=81920 * 2**20, used=(1 + h.index) * 1024 * 2**20)
        ),
        nvmlDeviceGetUtilizationRates=device(
            lambda h: SimpleNamespace(gpu=70 if h.index == 0 else 0, memory=10)
        ),
        nvmlDeviceGetPowerUsage=device(lambda h: 250_500),
        nvmlDeviceGetEnforcedPowerLimit=device(lambda h: 400_000),
        nvmlDeviceGetTemperature=device(lambda h, sensor: 65 if h.index == 0 else 93),
        nvmlDeviceGetTotalEccErrors=device(ecc),
        nvmlDeviceGetComputeRunningProcesses=device(
            lambda h: [SimpleNamespace(pid=4242)] if h.index == 0 else []
        ),
    )


async def test_nvml_readings_map_units_and_xid_events() -> None:
    nvml = fake_pynvml(xids=[(1, 79), (1, 48)])
    source = NvmlSource("gpu-node-3", nvml=nvml)
    first, second = await source.read(NOW)
    assert (first.node, first.gpu_uuid, first.model) == ("gpu-node-3", "GPU-fake-0", "A100-80GB")
    assert (first.utilization_pct, first.memory_used_mib, first.memory_total_mib) == (70.0, 1024, 81920)
    assert (first.power_w, first.power_limit_w, first.temperature_c) == (250.5, 400.0, 65.0)
    assert first.pods == ("pid/4242",) and first.xid_errors == ()
    assert (second.xid_errors, second.ecc_uncorrected, second.pods) == ((79, 48), 3, ())
    again = await source.read(NOW)  # the events were drained
    assert again[1].xid_errors == ()
    assert nvml.calls == ["init"]  # opened once
    (node,) = await source.inventory()
    assert [(g.uuid, g.model, g.memory_mib) for g in node.gpus] == [
        ("GPU-fake-0", "A100-80GB", 81920),
        ("GPU-fake-1", "A100-80GB", 81920),
    ]
    await source.close()
    assert nvml.calls == ["init", "free", "shutdown"]


async def test_a_lost_nvml_gpu_is_reported_lost_and_the_others_are_still_read() -> None:
    """XID 79: the GPU fell off the bus and every NVML call about it raises GPU_IS_LOST."""
    nvml = fake_pynvml(gpus=3)
    source = NvmlSource("gpu-node-3", nvml=nvml)
    assert [r.lost for r in await source.read(NOW)] == [False, False, False]
    nvml.broken[1] = 15
    nvml.pending.extend([(1, 79), (0, 48)])  # the lost GPU's own XID event cannot be placed
    first, lost, third = await source.read(NOW)
    assert (first.gpu_uuid, first.utilization_pct, first.lost) == ("GPU-fake-0", 70.0, False)
    assert first.xid_errors == (48,)
    assert (third.gpu_uuid, third.memory_used_mib, third.lost) == ("GPU-fake-2", 3072, False)
    assert (lost.node, lost.gpu_index, lost.gpu_uuid, lost.at, lost.lost) == (
        "gpu-node-3",
        1,
        "GPU-fake-1",
        NOW,
        True,
    )
    assert (lost.model, lost.memory_total_mib, lost.pods, lost.processes) == ("A100-80GB", 81920, None, None)
    change = HealthTracker().observe(lost)
    assert isinstance(change, BecameUnhealthy) and set(change.finding.faults) == {Fault.LOST}
    (node,) = await source.inventory()  # the lost GPU is still there, as last seen
    assert [g.uuid for g in node.gpus] == ["GPU-fake-0", "GPU-fake-1", "GPU-fake-2"]


async def test_a_gpu_lost_before_nvml_opens_leaves_the_others_readable() -> None:
    nvml = fake_pynvml(gpus=3)
    nvml.broken[1] = 15  # lost before this process started: its UUID cannot be known
    source = NvmlSource("gpu-node-3", nvml=nvml)
    assert [(r.gpu_index, r.gpu_uuid, r.lost) for r in await source.read(NOW)] == [
        (0, "GPU-fake-0", False),
        (2, "GPU-fake-2", False),
    ]
    (node,) = await source.inventory()
    assert [g.index for g in node.gpus] == [0, 2]


async def test_an_nvml_error_on_one_gpu_skips_that_gpu_only(caplog: pytest.LogCaptureFixture) -> None:
    nvml = fake_pynvml(gpus=3)
    source = NvmlSource("gpu-node-3", nvml=nvml)
    await source.read(NOW)
    nvml.broken[2] = 999  # NVML_ERROR_UNKNOWN: not a lost GPU, so no reading rather than a wrong one
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert [(r.gpu_index, r.lost) for r in await source.read(NOW)] == [(0, False), (1, False)]
    logged = [r for r in caplog.records if "GPU 2" in r.getMessage()]
    assert len(logged) == 1  # rate-limited: once, not every round
    del nvml.broken[2]
    assert [r.gpu_index for r in await source.read(NOW)] == [0, 1, 2]


async def test_nvml_without_the_library_fails_saying_so() -> None:
    source = NvmlSource("gpu-node-3", nvml=fake_pynvml(library=False))
    with pytest.raises(SourceUnavailable, match=r"NVML library \(libnvidia-ml.so.1\) not found"):
        await source.read(NOW)


def test_nvml_source_needs_the_node_name() -> None:
    with pytest.raises(ValueError, match="node_name"):
        NvmlSource("")


async def test_the_real_pynvml_on_a_machine_without_a_driver_fails_clearly() -> None:
    """Imports the real nvidia-ml-py lazily; on a machine with a driver it reads the real GPUs."""
    source = NvmlSource("this-node")
    try:
        readings = await source.read(NOW)
    except SourceUnavailable as exc:
        assert "NVML" in str(exc)
    else:
        assert all(r.gpu_uuid.startswith(("GPU-", "MIG-")) for r in readings)
        await source.close()


# -- settings ------------------------------------------------------------------------------------------
def test_settings_pick_the_source_and_name_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    for name in ("SOURCE", "DEVCLUSTER_URL", "DCGM_URL", "CLUSTER_FILE", "NODE_NAME"):
        monkeypatch.delenv(f"TESSERA_TELEMETRY_{name}", raising=False)

    from tessera.telemetry.config import SourceKind, TelemetrySettings

    assert TelemetrySettings(devcluster_url="http://d").chosen_source() is SourceKind.DEVCLUSTER
    assert TelemetrySettings(dcgm_url="http://e/metrics").chosen_source() is SourceKind.DCGM
    assert TelemetrySettings().chosen_source() is SourceKind.NVML
    with pytest.raises(ValidationError, match="dcgm_url: required by source=dcgm"):
        TelemetrySettings(source=SourceKind.DCGM)
