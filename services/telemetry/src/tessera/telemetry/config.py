"""Settings of the telemetry service: env prefix `TESSERA_TELEMETRY_`."""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import AliasChoices, BaseModel, Field, SecretStr, model_validator

from tessera.core.settings import ServiceSettings, StreamSettings, http_port, service_config
from tessera.core.tenant_tokens import AuthMode, TenantTokens
from tessera.telemetry.domain.pricing import CapacityType, Flavor, PriceBook


class SourceKind(StrEnum):
    AUTO = "auto"
    DEVCLUSTER = "devcluster"
    NVML = "nvml"
    DCGM = "dcgm"
    CLUSTER_FILE = "cluster-file"


class HealthSettings(BaseModel):
    max_temperature_c: float = Field(90.0, gt=0)
    max_power_ratio: float = Field(1.05, gt=0)
    xid_hold_s: float = Field(600.0, ge=0)
    trip_after: int = Field(2, ge=1, description="bad readings in a row before heat or power trips")
    recover_after: int = Field(6, ge=1, description="clean readings in a row before a GPU is healthy again")


class IdleSettings(BaseModel):
    idle_below_pct: float = Field(5.0, ge=0, le=100)
    busy_above_pct: float = Field(15.0, ge=0, le=100)
    idle_after_s: float = Field(600.0, ge=0)


class FlavorPrice(BaseModel):
    """A flavor of GPU capacity and its price per GPU-hour (in `PricingSettings.currency`)."""

    name: str
    gpu_model: str | None = Field(None, description="the GPU model the flavor's nodes have; default: name")
    capacity_type: Literal["on-demand", "spot"] | None = Field(
        None, description="when the flavor is only on-demand or only spot capacity"
    )
    on_demand_per_gpu_hour: float = Field(0.0, ge=0)
    spot_per_gpu_hour: float | None = Field(None, ge=0)


class PricingSettings(BaseModel):
    currency: str = "USD"
    flavors: list[FlavorPrice] = []
    file: Path | None = Field(
        None, description="a YAML file with `currency` and `flavors` (see examples/prices/), read at start"
    )

    def price_book(self) -> PriceBook:
        currency, flavors = self.currency, list(self.flavors)
        if self.file is not None:
            loaded = PricingSettings.model_validate(yaml.safe_load(self.file.read_text()) or {})
            currency, flavors = loaded.currency, [*flavors, *loaded.flavors]
        return PriceBook(
            tuple(
                Flavor(
                    f.name,
                    f.gpu_model,
                    CapacityType(f.capacity_type) if f.capacity_type else None,
                    f.on_demand_per_gpu_hour,
                    f.spot_per_gpu_hour,
                )
                for f in flavors
            ),
            currency,
        )


class UsageSettings(BaseModel):
    """Usage and cost accounting (domain/usage.py) and rightsizing (domain/rightsizing.py)."""

    enabled: bool = True
    max_gap_s: float = Field(30.0, gt=0, description="a longer gap between readings counts as this much")
    idle_below_pct: float = Field(5.0, ge=0, le=100, description="of what the container holds")
    idle_window_s: float = Field(600.0, ge=0)
    max_skew_s: float = Field(30.0, gt=0, description="node clocks further off are clamped and reported")
    flush_interval_s: float = Field(30.0, gt=0, description="how often usage rows are stored")
    hourly_retention_days: float = Field(35.0, gt=0)
    daily_retention_days: float = Field(400.0, gt=0)
    podresources_socket: str = Field(
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        description="the kubelet's PodResources socket on this node (NVML and dcgm sources)",
    )
    proc_root: Path = Field(
        Path("/proc"),
        description="the host's /proc (the NVML source reads /proc/<pid>/cgroup to find the pod of each "
        "GPU process; with the chart's hostPID, /proc itself)",
    )
    rightsizing_window_s: float = Field(3600.0, gt=0)
    rightsizing_min_samples: int = Field(30, ge=1)
    rightsizing_headroom: float = Field(1.2, ge=1.0)
    whole_gpu_below_pct: float = Field(10.0, ge=0, le=100)
    whole_gpu_window_s: float = Field(4 * 3600.0, gt=0)


class TelemetrySettings(ServiceSettings):
    model_config = service_config("telemetry")

    http_port: int = http_port(8081)
    source: SourceKind = Field(
        SourceKind.AUTO,
        description="auto: devcluster when devcluster_url is set, else cluster-file when cluster_file "
        "is set, else dcgm when dcgm_url is set, else nvml",
    )
    devcluster_url: str | None = Field(None, description="the devcluster's API server (readings at /nvml)")
    dcgm_url: str | None = Field(
        None, description="dcgm-exporter's metrics, e.g. http://localhost:9400/metrics"
    )
    node_name: str | None = Field(None, description="this node (DaemonSet: the downward API's spec.nodeName)")
    kubeconfig: Path | None = Field(
        None,
        validation_alias=AliasChoices("TESSERA_TELEMETRY_KUBECONFIG", "TESSERA_KUBECONFIG", "kubeconfig"),
        description="a kubeconfig of the cluster: the NVML source names each GPU process's pod and "
        "container from the pods on this node; none: processes stay pid/<n>",
    )
    cluster_file: Path | None = Field(
        None, description="a YAML cluster file: inventory only, every GPU idle (demos without a devcluster)"
    )
    sample_interval_s: float = Field(5.0, gt=0)
    inventory_interval_s: float = Field(15.0, gt=0)
    inventory_republish_s: float = Field(600.0, gt=0)
    rollup_retention_h: float = Field(24.0, gt=0)
    health: HealthSettings = HealthSettings()
    idle: IdleSettings = IdleSettings()
    usage: UsageSettings = UsageSettings()
    pricing: PricingSettings = PricingSettings()
    admission_url: str | None = Field(
        None,
        description="admission's API, to check a tenant's bearer token for GET /v1/usage; "
        "without it only the admin token (or auth disabled) may read usage",
    )
    auth: AuthMode = Field(
        "required", description="`disabled` only for a local stack: every caller may read every tenant"
    )
    admin_token: SecretStr | None = Field(None, description="the admin bearer token (admission's)")
    # Samples are many and short-lived.
    stream: StreamSettings = StreamSettings(max_age_s=3600.0)

    @model_validator(mode="after")
    def _source_has_what_it_needs(self) -> TelemetrySettings:
        needs = {
            SourceKind.DEVCLUSTER: ("devcluster_url", self.devcluster_url),
            SourceKind.DCGM: ("dcgm_url", self.dcgm_url),
            SourceKind.NVML: ("node_name", self.node_name),
            SourceKind.CLUSTER_FILE: ("cluster_file", self.cluster_file),
        }
        if self.source in needs and not needs[self.source][1]:
            field, _ = needs[self.source]
            raise ValueError(
                f"{field}: required by source={self.source.value} (TESSERA_TELEMETRY_{field.upper()})"
            )
        return self

    def chosen_source(self) -> SourceKind:
        if self.source is not SourceKind.AUTO:
            return self.source
        if self.devcluster_url:
            return SourceKind.DEVCLUSTER
        if self.cluster_file:
            return SourceKind.CLUSTER_FILE
        if self.dcgm_url:
            return SourceKind.DCGM
        return SourceKind.NVML

    def tokens(self) -> TenantTokens:
        """Who a bearer token reads usage for: checked with admission, as the other services' reads."""
        secret = self.admin_token.get_secret_value() if self.admin_token else None
        return TenantTokens(self.admission_url, self.auth, secret, service="usage here")


@lru_cache
def get_settings() -> TelemetrySettings:
    return TelemetrySettings()
