"""When a series is not fit to forecast: the fallback to the reactive value, and why. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from tessera.forecaster.domain.series import fill_gaps


class Degraded(StrEnum):
    """Why a series' served value is its last reading rather than its forecast."""

    NO_DATA = "no_data"
    TOO_LITTLE_HISTORY = "too_little_history"
    GAPS = "gaps"
    NOT_FINITE = "not_finite"
    NEGATIVE = "negative"
    CONSTANT = "constant"
    STALE = "stale"
    FIT_FAILED = "fit_failed"
    NO_FORECAST = "no_forecast"


@dataclass(frozen=True)
class InputPolicy:
    min_history: int = 60
    """steps of history a forecast needs (an hour of minutes)"""
    max_gap: int = 5
    """the longest run of missing steps filled by interpolation"""
    max_missing_share: float = 0.2
    """a series missing more of its recent steps than this is not forecast"""
    max_stale_steps: int = 3
    """a series whose newest reading is older than this many steps is not forecast"""


@dataclass(frozen=True)
class Prepared:
    """A series ready to fit (`values`, gaps filled), or the reason it is not (`degraded`)."""

    values: tuple[float, ...] = ()
    degraded: Degraded | None = None


def prepare(values: Sequence[float | None], policy: InputPolicy) -> Prepared:
    """Check a grid's values and fill its short gaps. Values must be finite, non-negative, not constant."""
    if not values:
        return Prepared(degraded=Degraded.NO_DATA)
    present = [v for v in values if v is not None and math.isfinite(v)]
    if not present:
        return Prepared(degraded=Degraded.NO_DATA)
    trailing = 0
    for v in reversed(values):
        if v is not None and math.isfinite(v):
            break
        trailing += 1
    if trailing > policy.max_stale_steps:
        return Prepared(degraded=Degraded.STALE)
    # the stale tail within tolerance: forecast from the newest reading
    body = list(values[: len(values) - trailing] if trailing else values)
    while body and (body[0] is None or not math.isfinite(body[0])):
        body.pop(0)
    if len(body) < policy.min_history:
        return Prepared(degraded=Degraded.TOO_LITTLE_HISTORY)
    # NaN and inf are a producer's fault, not a missing step: too many of them say so
    not_finite = sum(1 for v in body if v is not None and not math.isfinite(v))
    if not_finite / len(body) > policy.max_missing_share:
        return Prepared(degraded=Degraded.NOT_FINITE)
    missing = sum(1 for v in body if v is None or not math.isfinite(v))
    if missing / len(body) > policy.max_missing_share:
        return Prepared(degraded=Degraded.GAPS)
    filled = fill_gaps(body, policy.max_gap)
    if filled is None:
        return Prepared(degraded=Degraded.GAPS)
    if min(filled) < 0:
        return Prepared(degraded=Degraded.NEGATIVE)
    if max(filled) - min(filled) <= 1e-12 * max(1.0, abs(filled[0])):
        return Prepared(degraded=Degraded.CONSTANT)
    return Prepared(values=tuple(filled))
