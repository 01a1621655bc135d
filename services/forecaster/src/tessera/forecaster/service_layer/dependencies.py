"""What the forecaster's handlers, loops and routes share, built once in `bootstrap.py`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from tessera.cluster.leader import LeaderElector
from tessera.core.tenant_tokens import TenantTokens
from tessera.forecaster.domain.model import Series
from tessera.forecaster.domain.selection import Candidate
from tessera.forecaster.service_layer.engine import EngineConfig, SeriesForecaster
from tessera.forecaster.service_layer.unit_of_work import ForecasterUnitOfWork


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class ForecasterDeps:
    uow: Callable[[], ForecasterUnitOfWork]
    stop: asyncio.Event
    step_s: float
    engine: EngineConfig
    candidates: Callable[[], Sequence[Candidate]]
    history_s: float
    default_window_s: float
    clock: Callable[[], datetime] = utc_now
    #: the in-memory state of each series' forecaster (fitted models, pending forecasts)
    forecasters: dict[int, SeriesForecaster] = field(default_factory=dict)
    #: series already stored, by key, so a sample costs no lookup
    known_series: dict[str, Series] = field(default_factory=dict)
    #: set to run a round now rather than at the next step
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: set when a round finished (tests and the controller wait on it)
    round_done: asyncio.Event = field(default_factory=asyncio.Event)
    rounds: int = 0
    #: the port the KEDA external scaler listens on, once it does
    scaler_port: int | None = None
    #: passes of the PredictiveAutoscaler controller so far (tests wait on it)
    autoscaler_passes: int = 0
    #: with a kubeconfig, the elector of the replica that forecasts and reconciles (None: this one does)
    leader: LeaderElector | None = None
    #: who a bearer token reads for (admission says); by default only a configured admin token reads
    tokens: TenantTokens = field(default_factory=TenantTokens)

    def forecaster(self, series_id: int) -> SeriesForecaster:
        if series_id not in self.forecasters:
            self.forecasters[series_id] = SeriesForecaster(self.engine, self.candidates)
        return self.forecasters[series_id]
