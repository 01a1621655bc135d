"""How much of the served base is the model's forecast and how much the last reading. Pure.

The base served is `w * model + (1 - w) * last value`, w one of a few fixed weights. Each judged origin
leaves a pair of errors at the window (`actual - model`, `actual - last value`); the error of any blend
is the same blend of the pair. The margin on top is the q-quantile of recent errors, which minimises
their pinball loss at q, so what a base costs at a given share of short steps is that minimum: the
chooser serves the weight whose errors over the last `window` origins have the smallest pinball loss at
q about their own q-quantile. Until `min_judged` origins are known it serves the model alone (w = 1)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from tessera.forecaster.domain.margin import quantile

WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)


def pinball(errors: list[float], q: float) -> float:
    """The mean pinball loss at q of `errors` about their own q-quantile (the margin that covers them)."""
    at = quantile(errors, q)
    return sum(q * (e - at) if e >= at else (q - 1.0) * (e - at) for e in errors) / len(errors)


@dataclass
class WeightChooser:
    q: float = 0.9
    window: int = 240
    min_judged: int = 10
    weights: tuple[float, ...] = WEIGHTS
    pairs: deque[tuple[float, float]] = field(default_factory=deque)
    """(model error, last-value error) of the last `window` judged origins, oldest first"""

    def __post_init__(self) -> None:
        if not 0.0 <= self.q <= 1.0:
            raise ValueError("q must lie in [0, 1]")
        if not self.weights or any(not 0.0 <= w <= 1.0 for w in self.weights):
            raise ValueError("weights must lie in [0, 1]")
        self.pairs = deque(self.pairs, maxlen=self.window)

    def observe(self, model_error: float, last_error: float) -> None:
        if math.isfinite(model_error) and math.isfinite(last_error):
            self.pairs.append((model_error, last_error))

    def seed(self, pairs: Iterable[tuple[float, float]]) -> int:
        """Errors known before any judged ones (e.g. over the training history, oldest first) go before
        those held, as many of the newest as there is room for. Returns how many were kept."""
        room = self.window - len(self.pairs)
        finite = [(m, r) for m, r in pairs if math.isfinite(m) and math.isfinite(r)]
        kept = finite[-room:] if room > 0 else []
        self.pairs = deque([*kept, *self.pairs], maxlen=self.window)
        return len(kept)

    def losses(self) -> dict[float, float]:
        """Each weight's pinball loss over the pairs held (empty while too few are held)."""
        if len(self.pairs) < self.min_judged:
            return {}
        return {w: pinball([w * m + (1.0 - w) * r for m, r in self.pairs], self.q) for w in self.weights}

    def weight(self) -> float:
        """The weight of the model's forecast: the one with the smallest loss (on a tie, the larger);
        1 until `min_judged` origins are held."""
        losses = self.losses()
        if not losses:
            return 1.0
        return min(losses, key=lambda w: (losses[w], -w))


def blend(model: float, last: float, weight: float) -> float:
    return weight * model + (1.0 - weight) * last
