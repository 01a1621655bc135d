"""The work only one replica does: the forecasting rounds and the PredictiveAutoscaler controller.

With a kubeconfig (and leader election on), the replica holding the ``tessera-forecaster`` Lease does
it, as kube-scheduler's replicas do theirs (ADR 0018); the others keep recording metrics and serving
the forecasts the leader stored, and take over once it stops renewing. Without one, this replica does
it alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from tessera.forecaster.service_layer.dependencies import ForecasterDeps

log = logging.getLogger(__name__)

Work = Callable[[ForecasterDeps, asyncio.Event], Coroutine[Any, Any, None]]


def leader_work(*work: Work) -> Callable[[ForecasterDeps], Coroutine[Any, Any, None]]:
    async def lead_or_stand_by(deps: ForecasterDeps) -> None:
        async def run_all(until: asyncio.Event) -> None:
            await asyncio.gather(*(each(deps, until) for each in work))

        if deps.leader is None:
            await run_all(deps.stop)
            return

        async def lead(lost: asyncio.Event) -> None:
            log.info("leading: forecasting", extra={"identity": deps.leader and deps.leader.identity})
            await run_all(lost)
            log.info("no longer leading: forecasting stops")

        await deps.leader.run(deps.stop, lead)

    return lead_or_stand_by
