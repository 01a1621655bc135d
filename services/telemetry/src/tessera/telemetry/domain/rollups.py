"""Ten-second rollups of readings per GPU: mean and max of utilisation, memory, power, temperature. Pure.

Windows are aligned on the epoch (``[00:00:10, 00:00:20)``), so rollups from several telemetry
instances line up. A window closes when a reading of the same GPU lands in a later window, or on
``flush``.

A reading without a utilisation (`Reading.utilization_known` False: dcgm-exporter's NaN, a field not
exported) is left out of the utilisation's mean and max, as usage leaves it out of the used
GPU-hours: the mean is that of the readings with one, and both are None when no reading of the
window had one (its memory, power and temperature still count).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

WINDOW_S = 10


@dataclass(frozen=True)
class Rollup:
    gpu_uuid: str
    node: str
    gpu_index: int
    window_start: datetime
    samples: int
    #: of the window's readings with a utilisation; None when none had one
    utilization_mean_pct: float | None
    utilization_max_pct: float | None
    memory_mean_mib: float
    memory_max_mib: int
    power_mean_w: float
    power_max_w: float
    temperature_mean_c: float
    temperature_max_c: float


def window_start(at: datetime, seconds: int = WINDOW_S) -> datetime:
    epoch = at.astimezone(UTC).timestamp()
    return datetime.fromtimestamp(epoch - epoch % seconds, UTC)


@dataclass
class _Window:
    node: str
    gpu_index: int
    start: datetime
    samples: int = 0
    util_samples: int = 0
    util_sum: float = 0.0
    util_max: float = 0.0
    mem_sum: float = 0.0
    mem_max: int = 0
    power_sum: float = 0.0
    power_max: float = 0.0
    temp_sum: float = 0.0
    temp_max: float = float("-inf")

    def close(self, uuid: str) -> Rollup:
        n = self.samples
        return Rollup(
            uuid,
            self.node,
            self.gpu_index,
            self.start,
            n,
            round(self.util_sum / self.util_samples, 2) if self.util_samples else None,
            self.util_max if self.util_samples else None,
            round(self.mem_sum / n, 1),
            self.mem_max,
            round(self.power_sum / n, 2),
            self.power_max,
            round(self.temp_sum / n, 2),
            self.temp_max,
        )


@dataclass
class RollupBuilder:
    seconds: int = WINDOW_S
    _open: dict[str, _Window] = field(default_factory=dict)

    def add(
        self,
        gpu_uuid: str,
        node: str,
        gpu_index: int,
        at: datetime,
        utilization_pct: float,
        memory_used_mib: int,
        power_w: float,
        temperature_c: float,
        utilization_known: bool = True,
    ) -> Rollup | None:
        """Add a reading; the GPU's previous window when this reading closes it. Without
        `utilization_known`, `utilization_pct` means nothing and is not counted."""
        start = window_start(at, self.seconds)
        closed = None
        current = self._open.get(gpu_uuid)
        if current is not None and current.start != start:
            if start < current.start:
                return None  # a late reading of a window already written
            closed = current.close(gpu_uuid)
            current = None
        if current is None:
            current = self._open[gpu_uuid] = _Window(node, gpu_index, start)
        current.samples += 1
        if utilization_known:
            current.util_samples += 1
            current.util_sum += utilization_pct
            current.util_max = max(current.util_max, utilization_pct)
        current.mem_sum += memory_used_mib
        current.mem_max = max(current.mem_max, memory_used_mib)
        current.power_sum += power_w
        current.power_max = max(current.power_max, power_w)
        current.temp_sum += temperature_c
        current.temp_max = max(current.temp_max, temperature_c)
        return closed

    def flush(self, before: datetime | None = None) -> list[Rollup]:
        """Close every open window (that ended before ``before``, when given)."""
        done = [
            uuid
            for uuid, w in self._open.items()
            if before is None or w.start + timedelta(seconds=self.seconds) <= before
        ]
        return [self._open.pop(uuid).close(uuid) for uuid in done]
