"""Demand by pod shape, and the window that batches it so one burst causes one plan.

The inputs are plain values a consumer builds from events: the scheduler's `demand_changed` (a
full snapshot of what waits), `gang_unschedulable` (one gang, newer than the snapshot), the
forecaster's `forecast_updated` and telemetry's `gpu_idle`. As in nos, a window opens at the first
input and closes 60 s later, or sooner once 10 s pass with no new input. An input is new when it
changes what the window would hand the planner: a snapshot with other shapes, a gang not yet blocked
in the window (or blocked on other shapes), a forecast that asks for other pod counts, a GPU not yet
reported idle. A repeat (the forecaster republishes the same demand every step) opens a window, so
demand that waits is planned again, but does not hold one open: otherwise a source that repeats
itself more often than every 10 s made every plan wait the whole 60 s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from tessera.cluster.catalogue import CATALOGUE, parse_profile_name
from tessera.cluster.domain.gpu import MILLI_PER_GPU


class InvalidDemand(ValueError):
    """Demand that names an impossible shape, with the field and the reason."""


class ShapeKind(StrEnum):
    WHOLE = "whole"
    MIG = "mig"
    FRACTIONAL = "fractional"


@dataclass(frozen=True, slots=True)
class PodShape:
    """What one pending pod asks for: k whole GPUs, a share (milli) of one, or one MIG profile."""

    gpus: int = 1
    milli: int = MILLI_PER_GPU
    mig_profile: str | None = None
    models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise InvalidDemand(f"shape.gpus: must be >= 1, got {self.gpus}")
        if not 1 <= self.milli <= MILLI_PER_GPU:
            raise InvalidDemand(f"shape.milli: must be within 1..{MILLI_PER_GPU}, got {self.milli}")
        if self.milli < MILLI_PER_GPU and self.gpus != 1:
            raise InvalidDemand(
                f"shape.gpus: a share of a GPU ({self.milli} milli) takes 1 GPU, got {self.gpus}"
            )
        if self.mig_profile is not None:
            parse_profile_name(self.mig_profile)  # raises, naming the profile, when malformed
            if self.gpus != 1 or self.milli != MILLI_PER_GPU:
                raise InvalidDemand(f"shape.mig_profile: a {self.mig_profile} pod takes one instance alone")
        object.__setattr__(self, "models", tuple(sorted(self.models)))

    @classmethod
    def whole(cls, gpus: int = 1, models: Iterable[str] = ()) -> PodShape:
        return cls(gpus=gpus, models=tuple(models))

    @classmethod
    def share(cls, milli: int, models: Iterable[str] = ()) -> PodShape:
        return cls(milli=milli, models=tuple(models))

    @classmethod
    def mig(cls, profile: str) -> PodShape:
        return cls(mig_profile=profile)

    def sort_key(self) -> tuple[int, int, str, tuple[str, ...]]:
        return (self.gpus, self.milli, self.mig_profile or "", self.models)

    def __lt__(self, other: PodShape) -> bool:
        return self.sort_key() < other.sort_key()

    @property
    def kind(self) -> ShapeKind:
        if self.mig_profile is not None:
            return ShapeKind.MIG
        return ShapeKind.FRACTIONAL if self.milli < MILLI_PER_GPU else ShapeKind.WHOLE

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models


def _checked(shapes: Iterable[tuple[PodShape, int]]) -> tuple[tuple[PodShape, int], ...]:
    merged: dict[PodShape, int] = {}
    for shape, pods in shapes:
        if pods < 0:
            raise InvalidDemand(f"demand[{shape}]: pods must be >= 0, got {pods}")
        if pods:
            merged[shape] = merged.get(shape, 0) + pods
    return tuple(sorted(merged.items()))


@dataclass(frozen=True, slots=True)
class PendingDemand:
    """The scheduler's full snapshot of pods waiting, by shape (`demand_changed`)."""

    at: float
    shapes: tuple[tuple[PodShape, int], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shapes", _checked(self.shapes))


@dataclass(frozen=True, slots=True)
class GangBlocked:
    """One gang the scheduler could not place (`gang_unschedulable`), newer than the last snapshot."""

    at: float
    job_id: str
    shapes: tuple[tuple[PodShape, int], ...] = ()
    reason: str = ""

    def __post_init__(self) -> None:
        if not self.job_id:
            raise InvalidDemand("gang.job_id: must not be empty")
        object.__setattr__(self, "shapes", _checked(self.shapes))


@dataclass(frozen=True, slots=True)
class ForecastDemand:
    """Expected busy GPU-equivalents by shape (a GPU model or a MIG profile) over the next window."""

    at: float
    expected: tuple[tuple[str, float], ...]

    def __post_init__(self) -> None:
        for shape, value in self.expected:
            if not math.isfinite(value) or value < 0:
                raise InvalidDemand(f"forecast[{shape}]: expected must be a finite number >= 0, got {value}")


@dataclass(frozen=True, slots=True)
class GpuIdleSignal:
    """Telemetry saw a GPU held by pods do next to no work (`gpu_idle`)."""

    at: float
    node: str
    gpu_index: int
    utilization_pct: float


Signal = PendingDemand | GangBlocked | ForecastDemand | GpuIdleSignal


@dataclass(frozen=True, slots=True)
class DemandBatch:
    """What one closed window asks the planner to serve."""

    opened_at: float
    closed_at: float
    signals: int
    pending: dict[PodShape, int]
    forecast: dict[PodShape, int]
    idle_gpus: dict[tuple[str, int], float] = field(default_factory=dict)

    def demand(self) -> dict[PodShape, int]:
        """Pending pods, raised to the forecast where the forecast expects more of a shape."""
        result = dict(self.pending)
        for shape, pods in self.forecast.items():
            result[shape] = max(result.get(shape, 0), pods)
        return dict(sorted(result.items()))


def forecast_shapes(forecast: ForecastDemand) -> dict[PodShape, int]:
    """Forecast GPU-equivalents as pods: whole GPUs of a model, or instances of a MIG profile."""
    result: dict[PodShape, int] = {}
    for shape, expected in forecast.expected:
        if expected <= 0:
            continue
        if "g." in shape and shape.endswith(("gb", "gb+me")):
            compute, _, _ = parse_profile_name(shape)
            total = max(
                (m.mig.compute_slices for m in CATALOGUE.values() if m.mig and m.mig.has_profile(shape)),
                default=7,
            )
            result[PodShape.mig(shape)] = math.ceil(expected / (compute / total) - 1e-9)
        elif shape in CATALOGUE:
            result[PodShape.whole(models=(shape,))] = math.ceil(expected - 1e-9)
    return result


class DemandWindow:
    """Batches signals: closes ``window_s`` after it opened, or ``idle_s`` after the last signal that
    was new to it (see the module's docstring)."""

    def __init__(self, window_s: float = 60.0, idle_s: float = 10.0) -> None:
        if window_s <= 0 or idle_s <= 0:
            raise InvalidDemand(f"window: window_s and idle_s must be > 0, got {window_s} and {idle_s}")
        self.window_s = window_s
        self.idle_s = idle_s
        self._opened_at: float | None = None
        self._last_at = 0.0
        self._signals = 0
        self._snapshot: PendingDemand | None = None
        self._gangs: dict[str, GangBlocked] = {}
        self._forecast: ForecastDemand | None = None
        self._idle: dict[tuple[str, int], float] = {}

    @property
    def is_open(self) -> bool:
        return self._opened_at is not None

    def add(self, signal: Signal) -> None:
        if self._opened_at is None:
            self._opened_at = signal.at
            self._last_at = max(self._last_at, signal.at)
        elif self._is_new(signal):
            self._last_at = max(self._last_at, signal.at)
        self._signals += 1
        if isinstance(signal, PendingDemand):
            if self._snapshot is None or signal.at >= self._snapshot.at:
                self._snapshot = signal
                # gangs seen before this snapshot are part of it
                self._gangs = {j: g for j, g in self._gangs.items() if g.at > signal.at}
        elif isinstance(signal, GangBlocked):
            if self._snapshot is None or signal.at > self._snapshot.at:
                self._gangs[signal.job_id] = signal
        elif isinstance(signal, ForecastDemand):
            if self._forecast is None or signal.at >= self._forecast.at:
                self._forecast = signal
        else:
            self._idle[(signal.node, signal.gpu_index)] = signal.utilization_pct

    def _is_new(self, signal: Signal) -> bool:
        """Whether `signal` changes what the open window would hand the planner."""
        if isinstance(signal, PendingDemand):
            snapshot = self._snapshot
            return snapshot is None or (signal.at >= snapshot.at and signal.shapes != snapshot.shapes)
        if isinstance(signal, GangBlocked):
            if self._snapshot is not None and signal.at <= self._snapshot.at:
                return False  # part of the snapshot already
            known = self._gangs.get(signal.job_id)
            return known is None or known.shapes != signal.shapes
        if isinstance(signal, ForecastDemand):
            forecast = self._forecast
            if forecast is None:
                return True
            return signal.at >= forecast.at and forecast_shapes(signal) != forecast_shapes(forecast)
        return (signal.node, signal.gpu_index) not in self._idle

    def due(self, now: float) -> bool:
        if self._opened_at is None:
            return False
        return now - self._opened_at >= self.window_s or now - self._last_at >= self.idle_s

    def next_due(self) -> float | None:
        """When the window will close if nothing else arrives."""
        if self._opened_at is None:
            return None
        return min(self._opened_at + self.window_s, self._last_at + self.idle_s)

    def close(self, now: float) -> DemandBatch | None:
        """The batch, when the window is due; None (and nothing reset) otherwise."""
        if not self.due(now):
            return None
        assert self._opened_at is not None
        pending: dict[PodShape, int] = {}
        sources: list[Mapping[PodShape, int]] = [dict(self._snapshot.shapes)] if self._snapshot else []
        sources.extend(dict(g.shapes) for g in self._gangs.values())
        for source in sources:
            for shape, pods in source.items():
                pending[shape] = pending.get(shape, 0) + pods
        forecast = forecast_shapes(self._forecast) if self._forecast else {}
        batch = DemandBatch(self._opened_at, now, self._signals, pending, forecast, dict(self._idle))
        # The snapshot and the forecast stay true until replaced; the window and its gangs reset.
        self._opened_at = None
        self._signals = 0
        self._gangs = {}
        self._idle = {}
        return batch
