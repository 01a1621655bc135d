"""The forecaster's state in Postgres. The protocols are what the service layer sees; the `Sql*` classes
keep every query in this module."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import and_, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.forecaster.adapters.orm import forecast_errors, forecasts, gpus, models, observations, series
from tessera.forecaster.domain.forecast import Forecast
from tessera.forecaster.domain.model import ChosenModel, LatestForecast, Series
from tessera.forecaster.domain.series import Aggregation, SeriesKey


class SeriesRepository(Protocol):
    async def find(self, key: SeriesKey) -> Series | None: ...

    async def get_or_add(
        self, key: SeriesKey, step_s: float, aggregation: Aggregation, gpu_shape: str | None
    ) -> Series: ...

    async def all(self) -> list[Series]: ...

    async def matching(self, metric: str, selector: dict[str, str]) -> list[Series]: ...


class ObservationRepository(Protocol):
    async def add(self, series_id: int, at: datetime, part: str, value: float) -> None:
        """Add a reading to its step (`at` is the step's start) and part."""
        ...

    async def points(self, s: Series, since: datetime) -> dict[datetime, float]:
        """Each step's value from `since` on (see the table's comment for how parts combine)."""
        ...


class GpuRepository(Protocol):
    async def note(self, uuid: str, model: str, node: str) -> None: ...

    async def shape(self, uuid: str) -> str | None: ...


class ModelRepository(Protocol):
    async def save(self, chosen: ChosenModel) -> None: ...

    async def get(self, series_id: int) -> ChosenModel | None: ...


class ErrorRepository(Protocol):
    async def add(
        self, series_id: int, origin_at: datetime, model: str, forecast: float, actual: float, relative: float
    ) -> None: ...

    async def recent(self, series_id: int, limit: int) -> list[tuple[datetime, float]]:
        """The newest errors with their origins, oldest first."""
        ...


class ForecastRepository(Protocol):
    async def save(self, latest: LatestForecast) -> None: ...

    async def get(self, series_id: int) -> LatestForecast | None: ...


def _series(row: Any) -> Series:
    return Series(
        id=row.id,
        key=SeriesKey.of(row.metric, row.labels),
        step_s=row.step_s,
        aggregation=row.aggregation,
        gpu_shape=row.gpu_shape,
    )


class SqlSeriesRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def find(self, key: SeriesKey) -> Series | None:
        row = (await self.session.execute(select(series).where(series.c.key == str(key)))).first()
        return None if row is None else _series(row)

    async def get_or_add(
        self, key: SeriesKey, step_s: float, aggregation: Aggregation, gpu_shape: str | None
    ) -> Series:
        row = (await self.session.execute(select(series).where(series.c.key == str(key)))).first()
        if row is None:
            await self.session.execute(
                pg_insert(series)
                .values(
                    key=str(key),
                    metric=key.metric,
                    labels=dict(key.labels),
                    step_s=step_s,
                    aggregation=aggregation,
                    gpu_shape=gpu_shape,
                )
                .on_conflict_do_nothing(index_elements=[series.c.key])
            )
            row = (await self.session.execute(select(series).where(series.c.key == str(key)))).one()
        return _series(row)

    async def all(self) -> list[Series]:
        rows = await self.session.execute(select(series).order_by(series.c.id))
        return [_series(r) for r in rows]

    async def matching(self, metric: str, selector: dict[str, str]) -> list[Series]:
        query = select(series).where(series.c.metric == metric)
        if selector:
            query = query.where(series.c.labels.contains(selector))
        return [_series(r) for r in await self.session.execute(query.order_by(series.c.id))]


class SqlObservationRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def add(self, series_id: int, at: datetime, part: str, value: float) -> None:
        stmt = pg_insert(observations).values(series_id=series_id, at=at, part=part, total=value, count=1)
        await self.session.execute(
            stmt.on_conflict_do_update(
                index_elements=[observations.c.series_id, observations.c.at, observations.c.part],
                set_={
                    "total": observations.c.total + stmt.excluded.total,
                    "count": observations.c.count + 1,
                },
            )
        )

    async def points(self, s: Series, since: datetime) -> dict[datetime, float]:
        part_value = (
            observations.c.total if s.aggregation == "sum" else observations.c.total / observations.c.count
        )
        rows = await self.session.execute(
            select(observations.c.at, func.sum(part_value))
            .where(and_(observations.c.series_id == s.id, observations.c.at >= since))
            .group_by(observations.c.at)
        )
        return {at: float(value) for at, value in rows}


class SqlGpuRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def note(self, uuid: str, model: str, node: str) -> None:
        stmt = pg_insert(gpus).values(uuid=uuid, model=model, node=node)
        await self.session.execute(
            stmt.on_conflict_do_update(
                index_elements=[gpus.c.uuid],
                set_={"model": stmt.excluded.model, "node": stmt.excluded.node, "updated_at": func.now()},
            )
        )

    async def shape(self, uuid: str) -> str | None:
        row = (await self.session.execute(select(gpus.c.model).where(gpus.c.uuid == uuid))).first()
        return None if row is None else str(row[0])


class SqlModelRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def save(self, chosen: ChosenModel) -> None:
        values = {
            "chosen": chosen.chosen,
            "scores": chosen.scores,
            "horizon": chosen.horizon,
            "fit_seconds": chosen.fit_seconds,
            "reason": chosen.reason,
            "fitted_at": chosen.fitted_at,
        }
        stmt = pg_insert(models).values(series_id=chosen.series_id, **values)
        await self.session.execute(
            stmt.on_conflict_do_update(index_elements=[models.c.series_id], set_=values)
        )

    async def get(self, series_id: int) -> ChosenModel | None:
        row = (await self.session.execute(select(models).where(models.c.series_id == series_id))).first()
        if row is None:
            return None
        return ChosenModel(
            row.series_id, row.chosen, row.scores, row.horizon, row.fit_seconds, row.reason, row.fitted_at
        )


class SqlErrorRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def add(
        self, series_id: int, origin_at: datetime, model: str, forecast: float, actual: float, relative: float
    ) -> None:
        await self.session.execute(
            pg_insert(forecast_errors)
            .values(
                series_id=series_id,
                origin_at=origin_at,
                model=model,
                forecast=forecast,
                actual=actual,
                relative_error=relative,
            )
            .on_conflict_do_nothing()
        )

    async def recent(self, series_id: int, limit: int) -> list[tuple[datetime, float]]:
        rows = await self.session.execute(
            select(forecast_errors.c.origin_at, forecast_errors.c.relative_error)
            .where(forecast_errors.c.series_id == series_id)
            .order_by(forecast_errors.c.origin_at.desc())
            .limit(limit)
        )
        return [(at, float(v)) for at, v in rows][::-1]


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


class SqlForecastRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def save(self, latest: LatestForecast) -> None:
        f = latest.forecast
        values = {
            "origin_at": f.origin if f else None,
            "step_s": f.step_s if f else 0.0,
            "values": list(f.values) if f else [],
            "model": f.model if f else None,
            "margin": f.margin if f else 0.0,
            "level": f.level if f else 0.0,
            "last_value": _finite(latest.last_value),
            "last_at": latest.last_at,
            "degraded": latest.degraded,
            "computed_at": latest.computed_at,
        }
        stmt = pg_insert(forecasts).values(series_id=latest.series_id, **values)
        if f is None:  # degraded with no new forecast: keep the last good one, note why it is not served
            keep = {
                k: v for k, v in values.items() if k in ("last_value", "last_at", "degraded", "computed_at")
            }
            await self.session.execute(
                stmt.on_conflict_do_update(index_elements=[forecasts.c.series_id], set_=keep)
            )
        else:
            await self.session.execute(
                stmt.on_conflict_do_update(index_elements=[forecasts.c.series_id], set_=values)
            )

    async def get(self, series_id: int) -> LatestForecast | None:
        row = (
            await self.session.execute(select(forecasts).where(forecasts.c.series_id == series_id))
        ).first()
        if row is None:
            return None
        forecast = None
        if row.origin_at is not None and row.model is not None and row.values:
            forecast = Forecast(
                origin=row.origin_at,
                step_s=row.step_s,
                values=tuple(float(v) for v in row.values),
                model=row.model,
                margin=row.margin,
                level=row.level,
                last_value=row.last_value or 0.0,
            )
        return LatestForecast(
            row.series_id, forecast, row.degraded, row.last_value, row.last_at, row.computed_at
        )
