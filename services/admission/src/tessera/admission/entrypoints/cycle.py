"""The admission cycle, a background task of the service.

A cycle runs when something may have changed: a submission or release in this process wakes
it at once; otherwise it polls the change sequence every `cycle_interval_s` (other replicas,
consumers), runs when a preemption deadline is due, and at least every `full_cycle_interval_s`."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from tessera.admission.entrypoints.job_metrics import JobStateGauge
from tessera.admission.entrypoints.metrics import AdmissionMetrics
from tessera.admission.service_layer.cycle import change_mark, run_cycle
from tessera.admission.service_layer.dependencies import AdmissionDeps
from tessera.core import faults
from tessera.core.observability.ratelimit import RateLimitedLog
from tessera.core.waits import wait_any

log = logging.getLogger(__name__)
failures = RateLimitedLog(log)


def wake_cycle(deps: AdmissionDeps) -> None:
    deps.wake_cycle()


async def admission_cycle(deps: AdmissionDeps) -> None:
    ctx = deps.ctx
    interval = deps.cycle_interval_s
    full_every = deps.full_cycle_interval_s
    wake = deps.cycle_wake
    last_mark: int | None = None
    last_full = 0.0
    next_deadline: datetime | None = None
    metrics = AdmissionMetrics(ctx.metrics.registry)
    job_states = JobStateGauge(ctx.metrics.registry)
    while not ctx.stop.is_set():
        woken = wake.is_set()
        wake.clear()
        try:
            async with deps.uow() as uow:
                mark = await change_mark(uow)
            due = next_deadline is not None and datetime.now(UTC) >= next_deadline
            if woken or due or mark != last_mark or time.monotonic() - last_full >= full_every:
                last_mark = mark
                last_full = time.monotonic()
                started = time.perf_counter()
                try:
                    async with deps.uow() as uow:
                        report = await run_cycle(
                            uow,
                            before_commit=lambda: faults.hit("admission.cycle.before_commit"),
                            observe=metrics.observe,
                        )
                finally:
                    metrics.cycle_seconds.observe(time.perf_counter() - started)
                next_deadline = report.next_deadline
                if report.admitted or report.preemptions or report.released:
                    continue  # what was admitted may let more in (released victims, placements)
        except Exception:  # the database away: once per 30 s, with the count of the lines left out
            failures.error("cycle", "admission cycle failed", exc_info=True)
        if job_states.due():
            try:
                async with deps.uow() as uow:
                    job_states.set(await uow.jobs.count_by_state())
            except Exception:  # the gauge keeps its last counts; the cycle's failure is logged above
                log.debug("counting jobs by state failed", exc_info=True)
        await wait_any(ctx.stop, wake, timeout=interval)
