"""GPUs that pods hold but do not use. Pure.

A held GPU whose utilisation stays below ``idle_below_pct`` for ``idle_after_s`` is idle, reported
once. It is busy again only above ``busy_above_pct`` (hysteresis: a GPU hovering at the threshold
is not reported over and over), or when the pods holding it change or let it go.

A reading without a utilisation (`Reading.utilization_known` False) is neither low nor high: it does
not start an idle stretch, and one in progress goes on through it, unless no known utilisation came
for longer than ``max_unknown_s``: a stretch not yet reported then starts again at the next known low
reading. A GPU already reported idle stays so until a known reading says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from tessera.telemetry.domain.model import Reading


@dataclass(frozen=True)
class IdlePolicy:
    idle_below_pct: float = 5.0
    busy_above_pct: float = 15.0
    idle_after_s: float = 600.0
    #: a stretch not yet reported goes on through readings without a utilisation for this long at most
    max_unknown_s: float = 30.0

    def __post_init__(self) -> None:
        if self.busy_above_pct < self.idle_below_pct:
            raise ValueError("busy_above_pct: must not be below idle_below_pct")
        if self.idle_after_s < 0:
            raise ValueError("idle_after_s: must be >= 0")


@dataclass(frozen=True)
class BecameIdle:
    reading: Reading
    idle_since: datetime
    mean_utilization_pct: float


@dataclass(frozen=True)
class IdleEnded:
    gpu_uuid: str
    at: datetime


IdleChange = BecameIdle | IdleEnded


@dataclass
class _GpuIdle:
    pods: tuple[str, ...]
    since: datetime
    utilisation_sum: float = 0.0
    readings: int = 0
    reported: bool = False
    #: the last reading with a utilisation
    known_at: datetime | None = None


@dataclass
class IdleTracker:
    policy: IdlePolicy = field(default_factory=IdlePolicy)
    _gpus: dict[str, _GpuIdle] = field(default_factory=dict)

    def seed_idle(self, gpu_uuid: str, pods: tuple[str, ...], since: datetime) -> None:
        """An idle GPU reported before a restart: not reported again while it stays idle."""
        self._gpus[gpu_uuid] = _GpuIdle(tuple(sorted(pods)), since, reported=True)

    def idle(self) -> set[str]:
        return {uuid for uuid, state in self._gpus.items() if state.reported}

    def observe(self, reading: Reading) -> IdleChange | None:
        uuid = reading.gpu_uuid
        state = self._gpus.get(uuid)
        pods = tuple(sorted(reading.pods or ()))
        if not pods or (state is not None and state.pods != pods):
            return self._end(uuid, reading.at)
        if not reading.utilization_known:
            if state is not None and not state.reported:
                known_at = state.known_at or state.since
                if reading.at - known_at > timedelta(seconds=self.policy.max_unknown_s):
                    del self._gpus[uuid]
            return None
        if state is None:
            if reading.utilization_pct >= self.policy.idle_below_pct:
                return None
            state = self._gpus[uuid] = _GpuIdle(pods, reading.at)
        elif reading.utilization_pct > self.policy.busy_above_pct:
            return self._end(uuid, reading.at)
        state.known_at = reading.at
        state.utilisation_sum += reading.utilization_pct
        state.readings += 1
        if not state.reported and reading.at - state.since >= timedelta(seconds=self.policy.idle_after_s):
            state.reported = True
            return BecameIdle(reading, state.since, round(state.utilisation_sum / state.readings, 2))
        return None

    def _end(self, uuid: str, at: datetime) -> IdleChange | None:
        state = self._gpus.pop(uuid, None)
        return IdleEnded(uuid, at) if state is not None and state.reported else None
