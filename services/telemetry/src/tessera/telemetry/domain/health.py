"""Is a GPU fit for work? Faults read from one reading, and hysteresis over successive readings. Pure.

Hard faults (a non-benign XID, uncorrectable ECC errors, a lost GPU) trip at once: the hardware said
so. Soft faults (heat, power over the limit) trip after ``trip_after`` bad readings in a row, so a
spike is not an outage. Either way a GPU comes back only after ``recover_after`` clean readings in a
row, and an XID keeps a GPU faulty for ``xid_hold_s`` after it was last reported (NVML reports an XID
once; dcgm-exporter repeats the last one). A GPU flapping around a threshold is reported once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from tessera.telemetry.domain.model import Reading

#: XIDs the NVIDIA device plugin skips by default: application faults, not broken hardware
BENIGN_XIDS = frozenset({13, 31, 43, 45, 68, 109})


class Fault(StrEnum):
    XID = "xid"
    ECC = "ecc"
    TEMPERATURE = "temperature"
    POWER = "power"
    LOST = "lost"


HARD_FAULTS = frozenset({Fault.XID, Fault.ECC, Fault.LOST})


@dataclass(frozen=True)
class HealthPolicy:
    max_temperature_c: float = 90.0
    #: power draw above this fraction of the enforced limit is a fault
    max_power_ratio: float = 1.05
    xid_hold_s: float = 600.0
    trip_after: int = 2
    recover_after: int = 6
    benign_xids: frozenset[int] = BENIGN_XIDS

    def __post_init__(self) -> None:
        if self.trip_after < 1 or self.recover_after < 1:
            raise ValueError("trip_after and recover_after: must be at least 1")


@dataclass(frozen=True)
class Finding:
    """Faults seen in a reading, each with the reading behind it."""

    faults: dict[Fault, str]
    xid: int | None = None

    @property
    def hard(self) -> bool:
        return any(f in HARD_FAULTS for f in self.faults)


@dataclass(frozen=True)
class BecameUnhealthy:
    reading: Reading
    finding: Finding


@dataclass(frozen=True)
class Recovered:
    reading: Reading


HealthChange = BecameUnhealthy | Recovered


@dataclass
class _GpuHealth:
    unhealthy: bool = False
    bad_streak: int = 0
    good_streak: int = 0
    last_xid: int | None = None
    last_xid_at: datetime | None = None


@dataclass
class HealthTracker:
    policy: HealthPolicy = field(default_factory=HealthPolicy)
    _gpus: dict[str, _GpuHealth] = field(default_factory=dict)

    def seed_unhealthy(self, gpu_uuid: str) -> None:
        """A GPU reported unhealthy before a restart: it must recover before being reported again."""
        self._gpus[gpu_uuid] = _GpuHealth(unhealthy=True)

    def unhealthy(self) -> set[str]:
        return {uuid for uuid, state in self._gpus.items() if state.unhealthy}

    def inspect(self, reading: Reading, state: _GpuHealth | None = None) -> Finding:
        p = self.policy
        faults: dict[Fault, str] = {}
        if reading.lost:
            faults[Fault.LOST] = "the GPU does not answer (lost)"
        bad_xids = [x for x in reading.xid_errors if x and x not in p.benign_xids]
        xid: int | None = None
        if bad_xids:
            xid = bad_xids[-1]
        elif (
            state is not None
            and state.last_xid_at is not None
            and reading.at - state.last_xid_at < timedelta(seconds=p.xid_hold_s)
        ):
            xid = state.last_xid
        if xid is not None:
            faults[Fault.XID] = f"XID {xid} reported"
        if reading.ecc_uncorrected > 0:
            faults[Fault.ECC] = f"{reading.ecc_uncorrected} uncorrectable ECC error(s)"
        if not reading.lost and reading.temperature_c >= p.max_temperature_c:
            faults[Fault.TEMPERATURE] = (
                f"temperature {reading.temperature_c:g} C >= {p.max_temperature_c:g} C"
            )
        limit = reading.power_limit_w
        if limit and reading.power_w > limit * p.max_power_ratio:
            faults[Fault.POWER] = f"power {reading.power_w:g} W over the {limit:g} W limit"
        return Finding(faults, xid)

    def observe(self, reading: Reading) -> HealthChange | None:
        state = self._gpus.setdefault(reading.gpu_uuid, _GpuHealth())
        finding = self.inspect(reading, state)
        fresh_xids = [x for x in reading.xid_errors if x and x not in self.policy.benign_xids]
        if fresh_xids:
            state.last_xid, state.last_xid_at = fresh_xids[-1], reading.at
        if finding.faults:
            state.bad_streak += 1
            state.good_streak = 0
            if not state.unhealthy and (finding.hard or state.bad_streak >= self.policy.trip_after):
                state.unhealthy = True
                return BecameUnhealthy(reading, finding)
            return None
        state.good_streak += 1
        state.bad_streak = 0
        if state.unhealthy and state.good_streak >= self.policy.recover_after:
            state.unhealthy = False
            return Recovered(reading)
        return None
