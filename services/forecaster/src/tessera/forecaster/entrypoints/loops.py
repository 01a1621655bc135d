"""The forecaster's background loops: a forecasting round every step, and the models warmed at start."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence

from tessera.core.waits import wait_any
from tessera.forecaster.domain.selection import Candidate
from tessera.forecaster.service_layer.dependencies import ForecasterDeps
from tessera.forecaster.service_layer.forecasting import forecast_round

log = logging.getLogger(__name__)
#: the synthetic series the models are warmed on: long enough for every candidate
WARM_STEPS = 240
#: seconds after the start before the models are warmed
WARM_AFTER_S = 10.0


async def forecast_every_step(deps: ForecasterDeps, until: asyncio.Event | None = None) -> None:
    """A round every step until the service stops (or `until` is set: this replica stopped leading)."""
    ended = until or deps.stop
    while not (deps.stop.is_set() or ended.is_set()):
        try:
            await forecast_round(deps)
        except Exception as exc:  # the database may be restarting; the next round tries again
            log.warning("forecast round failed", extra={"error": repr(exc)})
        await wait_any(deps.stop, ended, deps.wake, timeout=deps.step_s)
        deps.wake.clear()


async def warm_models(deps: ForecasterDeps) -> None:
    """Fit every candidate once on a synthetic series, in a worker thread, as the service starts. A
    process's first fit of each model pays for importing darts and compiling statsforecast's models
    (about 40 s of CPU, against well under a second after), and the forecasting round waits for a
    series' fit: without this, the first series to reach enough history would hold every series'
    forecasts up that long. It begins once the service has had time to start: importing darts holds
    the GIL, and would slow the service's start. Returns when done (a background task may)."""
    await wait_any(deps.stop, timeout=WARM_AFTER_S)
    if deps.stop.is_set():
        return
    horizon = deps.engine.horizon
    # the service's stop ends warming after the fit in progress: the thread is not left to run on
    seconds = await asyncio.to_thread(warm, deps.candidates(), horizon, deps.stop.is_set)
    log.info("models warmed", extra={"seconds": round(seconds, 1), "stopped": deps.stop.is_set()})


def warm(candidates: Sequence[Candidate], horizon: int, stopped: Callable[[], bool] = lambda: False) -> float:
    """Fit each candidate on a noisy wave; a candidate that fails is logged, not raised; once `stopped`
    answers true no further candidate is fit. The seconds taken."""
    started = time.perf_counter()
    series = [10.0 + 5.0 * math.sin(i / 9) + (i * 7 % 5) / 5 for i in range(WARM_STEPS)]
    for candidate in candidates:
        if stopped():
            break
        if candidate.min_history(horizon) > len(series):
            continue
        try:
            candidate.fit(series, horizon)
        except Exception as exc:  # warming is best effort: the backtest scores it as it fails
            log.warning("warming a model failed", extra={"model": candidate.name, "error": repr(exc)})
    return time.perf_counter() - started
