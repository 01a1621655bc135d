"""Settings of the forecaster service: env prefix `TESSERA_FORECASTER_`.

``GET /v1/series`` needs a bearer token, checked with admission (``admission_url``) as telemetry checks
tokens for its usage API: a tenant's sees its own namespace's series; ``auth=disabled`` only for a local
stack."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import ClassVar

from pydantic import AliasChoices, Field, SecretStr

from tessera.cluster.leader_settings import LeaderElectionSettings
from tessera.core.settings import HttpsServing, ServiceSettings, http_port, service_config
from tessera.core.tenant_tokens import AuthMode, TenantTokens


class ForecasterLeaderElection(LeaderElectionSettings):
    """Only one replica forecasts and reconciles PredictiveAutoscalers: the holder of the
    ``tessera-forecaster`` Lease (with a kubeconfig). Every replica records metrics and serves the
    forecasts the leader stored, over the external metrics API and KEDA's scaler."""

    lease_name: str = Field("tessera-forecaster", min_length=1)


class MetricsTlsSettings(HttpsServing):
    """The external metrics API over HTTPS, as the aggregation layer calls an APIService's backend.
    Without a certificate it is served only on the plain HTTP port (`tessera up`, KEDA's path)."""

    section: ClassVar[str] = "metrics_tls"
    port: int = Field(6443, ge=0, le=65535, description="the HTTPS port of the external metrics API")


class ForecasterSettings(ServiceSettings):
    model_config = service_config("forecaster")

    http_port: int = http_port(8082)
    grpc_port: int = Field(
        9090, ge=0, le=65535, description="KEDA external scaler (gRPC); 0 picks a free port"
    )
    grpc_host: str = Field("0.0.0.0", description="address the KEDA external scaler listens on")
    step_s: float = Field(60.0, gt=0, description="seconds per step of every series")
    horizon_steps: int = Field(15, ge=1, le=1440, description="steps forecast ahead")
    window_steps: int = Field(6, ge=1, description="the window the margin is judged over, in steps")
    history_h: float = Field(24.0, gt=0, description="hours of history each refit sees")
    refit_every_steps: int = Field(60, ge=1, description="steps between backtests that choose the model")
    margin_q: float = Field(
        0.9, ge=0, le=1, description="quantile of recent under-forecasts served as margin"
    )
    margin_window: int = Field(240, ge=1, description="resolved forecasts the margin learns from")
    blend_last_value: bool = Field(
        True,
        description="serve the forecast blended with the last reading, the weight chosen each step by "
        "the recent pinball loss at margin_q (ADR 0031); false: the forecast alone",
    )
    min_history_steps: int = Field(60, ge=10, description="steps of history before a series is forecast")
    season_steps: int | None = Field(
        None, ge=2, description="a season length in steps for the seasonal naive candidate (1440: a day)"
    )
    default_window_s: float = Field(300.0, gt=0, description="prediction window when a request names none")
    observations_retention_h: float = Field(
        192.0, gt=0, description="observations older than this are deleted"
    )
    kubeconfig: Path | None = Field(
        None,
        validation_alias=AliasChoices("TESSERA_FORECASTER_KUBECONFIG", "TESSERA_KUBECONFIG", "kubeconfig"),
        description="a kubeconfig of the cluster whose PredictiveAutoscalers to reconcile; none: no controller",
    )
    leader_election: ForecasterLeaderElection = ForecasterLeaderElection()
    controller_interval_s: float = Field(
        15.0, gt=0, description="seconds between passes of the PredictiveAutoscaler controller"
    )
    scaler_address: str = Field(
        "",
        description="host:port KEDA reaches the external scaler at (ScaledObjects); default: loopback",
    )
    prometheus_url: str | None = Field(
        None, description="Prometheus' HTTP API (http://prometheus:9090) for prometheus metrics"
    )
    metrics_tls: MetricsTlsSettings = Field(
        default_factory=MetricsTlsSettings, description="the external metrics API over HTTPS (APIService)"
    )
    errors_retention_h: float = Field(
        48.0, gt=0, description="judged forecast errors older than this are deleted"
    )
    admission_url: str | None = Field(
        None,
        description="admission's API, to check a tenant's bearer token for GET /v1/series; "
        "without it only the admin token (or auth disabled) may list series",
    )
    auth: AuthMode = Field(
        "required",
        description="`disabled` only for a local stack: every caller lists every namespace's series",
    )
    admin_token: SecretStr | None = Field(None, description="the admin bearer token (admission's)")

    def tokens(self) -> TenantTokens:
        secret = self.admin_token.get_secret_value() if self.admin_token else None
        return TenantTokens(self.admission_url, self.auth, secret, service="the series")


@lru_cache
def get_settings() -> ForecasterSettings:
    return ForecasterSettings()
