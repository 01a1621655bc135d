"""Weighted dominant-resource share with a decayed usage history.

A queue's effective usage of a resource is its current usage plus an exponentially decayed
average of its past usage (Kueue's admission fair sharing: `h <- h*a + u*(1-a)` with
`a = 0.5 ** (dt / half_life)`). Its share is the largest, over resources, of effective usage
divided by the capacity of its cohort tree in that resource, scaled by the resource's weight
and divided by the queue's weight (weight 0: always last). Lower share goes first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from tessera.admission.domain.queueing.model import FairSharing
from tessera.admission.domain.queueing.resources import FlavorResource


class FairShareTracker:
    def __init__(self, policy: FairSharing, weights: Mapping[str, float]) -> None:
        self._policy = policy
        self._weights = dict(weights)
        self._history: dict[str, dict[FlavorResource, float]] = {q: {} for q in weights}
        self._last_sample: float | None = None
        self._last_usage: dict[str, dict[FlavorResource, int]] = {}

    @property
    def enabled(self) -> bool:
        return self._policy.enabled

    def history(self, queue: str) -> Mapping[FlavorResource, float]:
        return self._history.get(queue, {})

    def seed_history(self, queue: str, history: Mapping[FlavorResource, float]) -> None:
        """Restore a persisted history (e.g. after a restart)."""
        self._history[queue] = dict(history)

    def remember(self, usage: Mapping[str, Mapping[FlavorResource, int]]) -> None:
        """Note usage as a cycle leaves it; it is taken as held until the next `sample`."""
        self._last_usage = {q: dict(u) for q, u in usage.items()}

    def sample(self, now: float) -> None:
        """Fold the usage held since the last sample into the history."""
        half_life = self._policy.usage_half_life_s
        last, self._last_sample = self._last_sample, now
        held = self._last_usage
        if half_life <= 0 or last is None or now <= last:
            return
        keep = 0.5 ** ((now - last) / half_life)
        for queue, hist in self._history.items():
            current = held.get(queue, {})
            for fr in set(hist) | set(current):
                value = hist.get(fr, 0.0) * keep + current.get(fr, 0) * (1.0 - keep)
                if value < 1e-9:
                    hist.pop(fr, None)
                else:
                    hist[fr] = value

    def share(
        self,
        queue: str,
        current: Mapping[FlavorResource, int],
        capacity: Mapping[FlavorResource, int],
    ) -> float:
        weight = self._weights.get(queue, 1.0)
        if weight <= 0:
            return math.inf
        hist = self._history.get(queue, {})
        resource_weights = self._policy.resource_weights
        dominant = 0.0
        for fr in set(current) | set(hist):
            cap = capacity.get(fr, 0)
            if cap <= 0:
                continue
            effective = current.get(fr, 0) + hist.get(fr, 0.0)
            dominant = max(dominant, effective / cap * resource_weights.get(fr[1], 1.0))
        return dominant / weight
