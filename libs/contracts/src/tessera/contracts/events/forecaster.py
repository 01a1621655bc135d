"""The forecaster's command and event, version 1: application metrics in, expected GPU demand out."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from tessera.contracts import subjects
from tessera.contracts.base import Message


class RecordMetric(Message):
    TYPE: ClassVar[str] = "io.tessera.forecaster.record_metric.v1"
    SUBJECT: ClassVar[str] = subjects.RECORD_METRIC
    SUMMARY: ClassVar[str] = (
        "One observation of an application metric (request rate, queue length) for the forecaster to "
        "forecast; a PredictiveAutoscaler's `events` metric names it."
    )

    metric: str = Field(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z_:][A-Za-z0-9_:.-]*$",
        description="the metric's name, as a PredictiveAutoscaler's metric.events.name names it",
    )
    labels: dict[str, str] = Field(
        default_factory=dict, description="what tells this series apart from others of the same metric"
    )
    value: float = Field(description="the reading; a count of events when aggregation is `sum`")
    at: datetime = Field(description="when it was observed")
    aggregation: Literal["mean", "sum"] = Field(
        "mean",
        description="how readings in one step combine: `mean` for gauges (a rate), `sum` for counts of events",
    )
    gpu_shape: str | None = Field(
        None, description="the GPU shape (model or MIG profile) one unit of this metric keeps busy, if any"
    )

    def key(self) -> str:
        return self.metric


class ShapeDemand(BaseModel):
    """Expected demand for one GPU shape over the next window."""

    model_config = ConfigDict(frozen=True)

    shape: str = Field(description="GPU model or MIG profile; `unknown` when telemetry has not named it")
    expected: float = Field(ge=0, description="the largest forecast over the window, GPU-equivalents busy")
    served: float = Field(
        ge=0, description="what the forecaster serves to autoscalers: expected plus the learned margin"
    )
    source: Literal["forecast", "reactive"] = Field(
        description="`reactive` when a series fell back to its last reading (see reason)"
    )
    reason: str | None = None


class ForecastUpdated(Message):
    TYPE: ClassVar[str] = "io.tessera.forecaster.forecast_updated.v1"
    SUBJECT: ClassVar[str] = subjects.FORECAST_UPDATED
    SUMMARY: ClassVar[str] = "New forecasts: expected GPU demand by shape over the next window (for slicing)."

    at: datetime = Field(description="the forecast's origin: the newest observation it saw")
    window_s: float = Field(gt=0, description="how far ahead the expected demand reaches")
    demand: list[ShapeDemand] = []

    def key(self) -> str:
        return "cluster"
