"""The forecaster's unit of work: its repositories on one transaction, with the outbox and the inbox."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tessera.core.db.uow import UnitOfWork
from tessera.forecaster.adapters.repository import (
    ErrorRepository,
    ForecastRepository,
    GpuRepository,
    ModelRepository,
    ObservationRepository,
    SeriesRepository,
    SqlErrorRepository,
    SqlForecastRepository,
    SqlGpuRepository,
    SqlModelRepository,
    SqlObservationRepository,
    SqlSeriesRepository,
)

if TYPE_CHECKING:  # the session is only handed on to the adapters
    from sqlalchemy.ext.asyncio import AsyncSession


class ForecasterUnitOfWork(UnitOfWork):
    series: SeriesRepository
    observations: ObservationRepository
    gpus: GpuRepository
    models: ModelRepository
    errors: ErrorRepository
    forecasts: ForecastRepository

    def open_repositories(self, session: AsyncSession) -> None:
        self.series = SqlSeriesRepository(session)
        self.observations = SqlObservationRepository(session)
        self.gpus = SqlGpuRepository(session)
        self.models = SqlModelRepository(session)
        self.errors = SqlErrorRepository(session)
        self.forecasts = SqlForecastRepository(session)
