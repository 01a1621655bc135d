"""The margin served on top of a forecast, learned online from how far recent forecasts fell short. Pure."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile by linear interpolation between order statistics (numpy's default)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    pos = min(max(q, 0.0), 1.0) * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class MarginLearner:
    """Keeps the errors `actual - forecast` of the last `window` resolved forecasts and serves their
    q-quantile as the margin, never below 0: it covers under-forecasts; over-forecasts need none.

    Errors are in the series' own unit. (Errors relative to the forecast blow up where the load is near
    zero; on the GenAI trace they cost twice the replicas for the same share of minutes short.)"""

    q: float = 0.9
    window: int = 240
    min_errors: int = 10
    errors: deque[float] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if not 0.0 <= self.q <= 1.0:
            raise ValueError("q must lie in [0, 1]")
        if self.window < 1:
            raise ValueError("window must hold at least one error")
        self.errors = deque(self.errors, maxlen=self.window)

    def observe(self, forecast: float, actual: float) -> float:
        """Record a resolved forecast; returns its error (positive: the forecast fell short)."""
        error = actual - forecast
        if math.isfinite(error):
            self.errors.append(error)
        return error

    def extend(self, errors: Iterable[float]) -> None:
        self.errors.extend(e for e in errors if math.isfinite(e))

    def seed(self, errors: Sequence[float]) -> int:
        """Calibrate before judged errors fill the window: `errors` (oldest first, e.g. a model's
        out-of-sample errors on its training history) go before those already held, as many of the newest
        as there is room for. Returns how many were kept."""
        room = self.window - len(self.errors)
        finite = [e for e in errors if math.isfinite(e)]
        kept = finite[-room:] if room > 0 else []
        self.errors = deque([*kept, *self.errors], maxlen=self.window)
        return len(kept)

    def margin(self) -> float | None:
        """The q-quantile of recent errors, at least 0; None until `min_errors` are known."""
        if len(self.errors) < self.min_errors:
            return None
        return max(0.0, quantile(list(self.errors), self.q))
