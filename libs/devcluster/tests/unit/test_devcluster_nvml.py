"""Simulated NVML readings."""

from __future__ import annotations

import pytest

from tessera.cluster.cluster_file import NodeSpec
from tessera.devcluster.sim.devices import Holding
from tessera.devcluster.sim.nvml import DutyCycleTrace, NvmlModel, PodLoad
from tessera.devcluster.sim.state import SimGpu, SimNode

TRACE = DutyCycleTrace({"c1": ([0.0, 60.0, 120.0], [10.0, 50.0, 90.0])})


def gpu() -> SimGpu:
    return SimNode.from_spec(NodeSpec("n", 1, 1, "H100-80GB", 1, 81920), 0).gpus[0]


@pytest.mark.parametrize(("at", "value"), [(0, 10.0), (59, 10.0), (60, 50.0), (150, 90.0), (180, 10.0)])
def test_the_duty_cycle_replays_and_loops(at: float, value: float) -> None:
    assert TRACE.value("any-pod", at) == value


def test_an_idle_gpu_reads_cool_and_empty() -> None:
    reading = NvmlModel(TRACE).read("n", gpu(), [], 0)

    assert (reading.utilisation_pct, reading.memory_used_mib, reading.health) == (0.0, 0, "healthy")
    assert reading.power_w == pytest.approx(700 * 0.15)


def test_inference_and_training_loads_add_up() -> None:
    device = gpu()
    inference = PodLoad("ns/infer", Holding(device.uuid, 300), "inference")
    training = PodLoad("ns/train", Holding(device.uuid, 500), "training")

    alone = NvmlModel(TRACE).read("n", device, [inference], 60)
    both = NvmlModel(TRACE).read("n", device, [inference, training], 60)

    assert alone.utilisation_pct == 50.0
    assert both.utilisation_pct == 100.0  # capped
    assert both.memory_used_mib > alone.memory_used_mib > 0
    assert both.pods == ("ns/infer", "ns/train")
    assert both.temperature_c > alone.temperature_c


def test_faults_show_in_readings() -> None:
    device = gpu()
    device.xids.append(48)
    device.overheating = True
    hot = NvmlModel(TRACE).read("n", device, [], 0)
    device.lost = True
    lost = NvmlModel(TRACE).read("n", device, [], 0)

    assert (hot.health, hot.xid_errors, hot.throttled, hot.temperature_c) == ("unhealthy", (48,), True, 96.0)
    assert (lost.health, lost.power_w) == ("lost", 0.0)
