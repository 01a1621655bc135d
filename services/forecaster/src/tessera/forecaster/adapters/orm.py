"""Tables of the forecaster schema: series and their observations, the models chosen for them with their
backtest scores, the errors of past forecasts (the margin learns from them) and the latest forecasts."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB

from tessera.core.db.messaging_tables import add_messaging_tables

metadata = MetaData(schema="forecaster")
outbox, inbox = add_messaging_tables(metadata)

series = Table(
    "series",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("key", String(512), nullable=False, unique=True),
    Column("metric", String(200), nullable=False, index=True),
    Column("labels", JSONB, nullable=False),
    Column("step_s", Float, nullable=False),
    Column("aggregation", String(16), nullable=False),
    Column("gpu_shape", String(128), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

#: one row per series, step and part; a step's value is, over its parts, the sum of each part's mean
#: (aggregation `mean`) or of its total (`sum`). Telemetry's parts are GPUs; a metric's part is ''.
observations = Table(
    "observations",
    metadata,
    Column("series_id", BigInteger, ForeignKey("series.id", ondelete="CASCADE"), primary_key=True),
    Column("at", DateTime(timezone=True), primary_key=True),
    Column("part", String(128), primary_key=True, server_default=""),
    Column("total", Float, nullable=False),
    Column("count", Integer, nullable=False),
    Index("ix_observations_at", "at"),
)

#: the GPU shape (model) of each GPU telemetry named in its inventory
gpus = Table(
    "gpus",
    metadata,
    Column("uuid", String(128), primary_key=True),
    Column("model", String(128), nullable=False),
    Column("node", String(253), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

#: the model chosen for a series by its latest backtest, with every candidate's scores
models = Table(
    "models",
    metadata,
    Column("series_id", BigInteger, ForeignKey("series.id", ondelete="CASCADE"), primary_key=True),
    Column("chosen", String(64), nullable=True),
    Column("scores", JSONB, nullable=False),
    Column("horizon", Integer, nullable=False),
    Column("fit_seconds", Float, nullable=False),
    Column("reason", String(64), nullable=True),
    Column("fitted_at", DateTime(timezone=True), nullable=False),
)

#: resolved forecasts: what was served (window maximum) against what came, as a share of the forecast
forecast_errors = Table(
    "forecast_errors",
    metadata,
    Column("series_id", BigInteger, ForeignKey("series.id", ondelete="CASCADE"), primary_key=True),
    Column("origin_at", DateTime(timezone=True), primary_key=True),
    Column("model", String(64), nullable=False),
    Column("forecast", Float, nullable=False),
    Column("actual", Float, nullable=False),
    Column("relative_error", Float, nullable=False),
    Index("ix_forecast_errors_origin_at", "origin_at"),
)

#: the latest forecast of each series (the last good one stays until a newer one replaces it), and the
#: reason the series is served reactively when it is
forecasts = Table(
    "forecasts",
    metadata,
    Column("series_id", BigInteger, ForeignKey("series.id", ondelete="CASCADE"), primary_key=True),
    Column("origin_at", DateTime(timezone=True), nullable=True),
    Column("step_s", Float, nullable=False),
    Column("values", JSONB, nullable=False),
    Column("model", String(64), nullable=True),
    Column("margin", Float, nullable=False),
    Column("level", Float, nullable=False),
    Column("last_value", Float, nullable=True),
    Column("last_at", DateTime(timezone=True), nullable=True),
    Column("degraded", String(64), nullable=True),
    Column("computed_at", DateTime(timezone=True), nullable=False),
)
