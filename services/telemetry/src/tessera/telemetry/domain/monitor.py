"""The monitor: each batch of readings in, rollups and health and idle changes out. Pure."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from tessera.telemetry.domain.health import HealthChange, HealthPolicy, HealthTracker
from tessera.telemetry.domain.idle import IdleChange, IdlePolicy, IdleTracker
from tessera.telemetry.domain.model import Reading
from tessera.telemetry.domain.rollups import Rollup, RollupBuilder

#: a GPU silent this long after its window ended gets the window written anyway
_GRACE = timedelta(seconds=30)


@dataclass
class Observation:
    rollups: list[Rollup] = field(default_factory=list)
    health: list[HealthChange] = field(default_factory=list)
    idle: list[IdleChange] = field(default_factory=list)

    @property
    def health_changed(self) -> bool:
        return bool(self.health)


@dataclass
class Monitor:
    health: HealthTracker
    idle: IdleTracker
    rollups: RollupBuilder = field(default_factory=RollupBuilder)

    @classmethod
    def with_policies(cls, health: HealthPolicy, idle: IdlePolicy) -> Monitor:
        return cls(HealthTracker(health), IdleTracker(idle))

    def observe(self, readings: list[Reading], now: datetime) -> Observation:
        out = Observation()
        for r in readings:
            if not r.lost:
                closed = self.rollups.add(
                    r.gpu_uuid,
                    r.node,
                    r.gpu_index,
                    r.at,
                    r.utilization_pct,
                    r.memory_used_mib,
                    r.power_w,
                    r.temperature_c,
                    r.utilization_known,
                )
                if closed is not None:
                    out.rollups.append(closed)
            health = self.health.observe(r)
            if health is not None:
                out.health.append(health)
            idle = self.idle.observe(r)
            if idle is not None:
                out.idle.append(idle)
        # a GPU that stopped reporting still gets its last window written
        out.rollups.extend(self.rollups.flush(before=now - _GRACE))
        return out

    def checkpoint(self) -> Monitor:
        """A copy to go back to when the observation could not be stored."""
        return copy.deepcopy(self)
