"""Named, timed steps, the way Kueue writes its scheduling cycle: each step is a span of its own,
and the durations go out together in one structured log line when the whole is done."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tessera.core.observability.tracing import tracer


class TimedSteps:
    """``with steps("read_nodes"): ...`` runs a step in the span ``<name>.read_nodes`` and keeps its
    duration; :meth:`log` reports them all, in the order they ran."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, step: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            with tracer().start_as_current_span(f"{self.name}.{step}"):
                yield
        finally:
            self.seconds[step] = self.seconds.get(step, 0.0) + time.perf_counter() - started

    def log(self, logger: logging.Logger, message: str, **extra: object) -> None:
        steps_ms = {step: round(seconds * 1000.0, 3) for step, seconds in self.seconds.items()}
        logger.info(message, extra={**extra, "steps_ms": steps_ms})
