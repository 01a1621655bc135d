"""One forecasting round: every series is read, forecast from its newest complete step (the chosen
model refit on schedule), judged against what came, and stored; the expected GPU demand by shape goes
out as `forecast_updated`. The fitting runs in a worker thread; a series that fails is served
reactively with its reason, and the round goes on."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from tessera.contracts.events import ForecastUpdated, ShapeDemand
from tessera.forecaster.domain.checks import Degraded
from tessera.forecaster.domain.forecast import serve
from tessera.forecaster.domain.model import ChosenModel, LatestForecast, Series
from tessera.forecaster.domain.series import Grid, bucket
from tessera.forecaster.service_layer.dependencies import ForecasterDeps
from tessera.forecaster.service_layer.engine import SeriesForecaster, Update

log = logging.getLogger(__name__)


@dataclass
class _Work:
    series: Series
    grid: Grid | None
    seed_errors: list[tuple[datetime, float]]
    """(origin, error) restored from storage, oldest first"""


def _compute(forecaster: SeriesForecaster, work: _Work) -> Update:
    grid = work.grid
    if grid is None:
        return Update(None, Degraded.NO_DATA, None)
    try:
        return forecaster.step(list(grid.values), grid.end, grid.step_s)
    except Exception as exc:  # never let one series end the loop
        log.warning("forecast failed", extra={"series": str(work.series.key), "error": repr(exc)})
        return Update(None, Degraded.FIT_FAILED, grid.last_value())


async def forecast_round(deps: ForecasterDeps) -> int:
    """Forecast every series once; returns how many got a forecast."""
    now = deps.clock()
    work: list[_Work] = []
    async with deps.uow() as uow:
        for s in await uow.series.all():
            last_complete = bucket(now, s.step_s) - timedelta(seconds=s.step_s)
            since = last_complete - timedelta(seconds=deps.history_s)
            points = await uow.observations.points(s, since)
            grid = Grid.from_points(points, s.step_s, until=last_complete)
            seed = (
                [] if s.id in deps.forecasters else await uow.errors.recent(s.id, deps.engine.margin_window)
            )
            work.append(_Work(s, grid, seed))
    updates: list[tuple[_Work, Update]] = []
    for item in work:
        forecaster = deps.forecaster(item.series.id)
        if item.seed_errors:
            restored = item.seed_errors
            forecaster.seed_errors([e for _, e in restored], since=restored[0][0], until=restored[-1][0])
        updates.append((item, await asyncio.to_thread(_compute, forecaster, item)))
    forecast_count = 0
    async with deps.uow() as uow:
        demand: dict[str, list[tuple[str, float, float, str, str | None]]] = defaultdict(list)
        window_s = deps.engine.window_steps * deps.step_s
        for item, update in updates:
            s = item.series
            grid = item.grid
            for origin, model, forecast, actual in update.judged:
                await uow.errors.add(s.id, origin, model, forecast, actual, actual - forecast)
            if update.selection is not None:
                scores = {
                    score.name: {
                        "mae": score.mae if score.ok else None,
                        "wape": score.wape if score.ok else None,
                        "under_share": score.under_share if score.ok else None,
                        "error": score.error,
                    }
                    for score in update.selection.scores
                }
                await uow.models.save(
                    ChosenModel(
                        s.id,
                        update.selection.chosen,
                        scores,
                        deps.engine.horizon,
                        update.fit_seconds,
                        None if update.selection.chosen else str(Degraded.FIT_FAILED),
                        now,
                    )
                )
            last_at = None
            if grid is not None:
                idx = max((i for i, v in enumerate(grid.values) if v is not None), default=None)
                last_at = grid.at(idx) if idx is not None else None
            await uow.forecasts.save(
                LatestForecast(
                    s.id,
                    update.forecast,
                    str(update.degraded) if update.degraded else None,
                    update.last_value,
                    last_at,
                    now,
                )
            )
            forecast_count += update.forecast is not None
            if s.gpu_shape is not None:
                served = serve(
                    update.forecast,
                    now=now,
                    window_s=window_s,
                    last_value=update.last_value,
                    degraded=update.degraded,
                )
                demand[s.gpu_shape].append(
                    (str(s.key), served.expected, served.value, served.source, served.reason)
                )
        if demand:
            await uow.publish(_forecast_updated(now, window_s, demand))
        await uow.commit()
    deps.rounds += 1
    deps.round_done.set()
    return forecast_count


def _forecast_updated(
    now: datetime, window_s: float, demand: dict[str, list[tuple[str, float, float, str, str | None]]]
) -> ForecastUpdated:
    shapes = []
    for shape, rows in sorted(demand.items()):
        reactive = [f"{key}: {reason}" for key, _, _, source, reason in rows if source == "reactive"]
        shapes.append(
            ShapeDemand(
                shape=shape,
                expected=sum(r[1] for r in rows),
                served=sum(r[2] for r in rows),
                source="reactive" if reactive else "forecast",
                reason="; ".join(reactive) or None,
            )
        )
    return ForecastUpdated(at=now, window_s=window_s, demand=shapes)
