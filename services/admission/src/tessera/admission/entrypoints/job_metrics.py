"""Jobs by state, counted from admission's table: `tessera_admission_jobs{state}`.

The cycle's own gauges (pending and admitted per queue) see only the jobs a cycle loads; this one
counts every job the table holds, ended ones included, so a dashboard shows how many succeeded,
failed or were rejected, and a job left behind in `admitted` or `placed` stands out. The cycle's task
samples it after a cycle at most every `SAMPLE_EVERY_S`, with one grouped count (over the index on
state); every state is reported, 0 when no job is in it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Gauge

from tessera.admission.domain.model import JobState

SAMPLE_EVERY_S = 5.0


class JobStateGauge:
    """The gauge, and when it was last sampled."""

    def __init__(self, registry: CollectorRegistry, every_s: float = SAMPLE_EVERY_S) -> None:
        self.gauge = Gauge(
            "tessera_admission_jobs", "Jobs in admission's table, by state", ["state"], registry=registry
        )
        self.every_s = every_s
        self._sampled_at: float | None = None

    def due(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self._sampled_at is None or now - self._sampled_at >= self.every_s

    def set(self, counts: Mapping[str, int], now: float | None = None) -> None:
        self._sampled_at = time.monotonic() if now is None else now
        known = [state.value for state in JobState]
        for name in known:
            self.gauge.labels(state=name).set(counts.get(name, 0))
        for name, count in counts.items():  # a state this code does not know yet
            if name not in known:
                self.gauge.labels(state=name).set(count)
