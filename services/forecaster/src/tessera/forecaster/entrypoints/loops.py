"""The forecaster's background loop: a forecasting round every step."""

from __future__ import annotations

import logging

from tessera.core.waits import wait_any
from tessera.forecaster.service_layer.dependencies import ForecasterDeps
from tessera.forecaster.service_layer.forecasting import forecast_round

log = logging.getLogger(__name__)


async def forecast_every_step(deps: ForecasterDeps) -> None:
    while not deps.stop.is_set():
        try:
            await forecast_round(deps)
        except Exception as exc:  # the database may be restarting; the next round tries again
            log.warning("forecast round failed", extra={"error": repr(exc)})
        await wait_any(deps.stop, deps.wake, timeout=deps.step_s)
        deps.wake.clear()
