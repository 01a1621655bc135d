"""Settings of the slicing service: env prefix `TESSERA_SLICING_`.

``kubeconfig`` (or the shared ``TESSERA_KUBECONFIG``) lets the service plan and apply layouts on a
cluster. Without one it only records the demand it hears of."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from functools import lru_cache
from pathlib import Path

from pydantic import AliasChoices, BaseModel, Field

from tessera.cluster.leader_settings import LeaderElectionSettings
from tessera.core.recording.wiring import observed_retention_h
from tessera.core.settings import ServiceSettings, http_port, service_config
from tessera.slicing.domain.cluster_plan import PlannerSettings
from tessera.slicing.domain.operation import RetryPolicy
from tessera.slicing.domain.usage_history import UsageSettings


class OperationSettings(BaseModel):
    """How an operation retries and how long each step may take."""

    max_attempts: int = Field(3, ge=1, description="applies of one change before the node is left cordoned")
    backoff_s: float = Field(5.0, gt=0, description="wait after the first failed apply; doubles after each")
    max_backoff_s: float = Field(300.0, gt=0)
    drain_timeout_s: float = Field(1800.0, gt=0, description="how long to wait for pods to leave a GPU")
    apply_timeout_s: float = Field(300.0, gt=0, description="how long the MIG manager may stay pending")
    reboot_allowance_s: float = Field(
        900.0,
        ge=0,
        le=86400,
        description=(
            "time the MIG manager reports rebooting the node is not counted against apply_timeout_s, "
            "up to this much an attempt (0: a reboot counts like pending)"
        ),
    )
    verify_timeout_s: float = Field(120.0, gt=0, description="how long until the node advertises the change")
    checkpoint_notice_s: float | None = Field(
        300.0,
        gt=0,
        description=(
            "a checkpointable job holding a GPU being drained gets this long to checkpoint (asked by the "
            "checkpoint service), then its pods are moved; null: such jobs are waited for like any pod"
        ),
    )

    def policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.max_attempts,
            backoff=timedelta(seconds=self.backoff_s),
            max_backoff=timedelta(seconds=self.max_backoff_s),
            drain_timeout=timedelta(seconds=self.drain_timeout_s),
            apply_timeout=timedelta(seconds=self.apply_timeout_s),
            reboot_allowance=timedelta(seconds=self.reboot_allowance_s),
            verify_timeout=timedelta(seconds=self.verify_timeout_s),
        )


class PlanningSettings(BaseModel):
    """When the planner runs and how eagerly it changes layouts."""

    window_s: float = Field(60.0, gt=0, description="a demand window closes this long after it opened")
    idle_s: float = Field(10.0, gt=0, description="or this long after the last signal new to it")
    reconfigure_minutes: float = Field(2.0, ge=0, description="capacity a GPU loses while reconfigured")
    benefit_horizon_minutes: float = Field(30.0, gt=0)
    hysteresis_ratio: float = Field(1.5, ge=1.0, description="benefit must exceed cost this many times")
    min_dwell_s: float = Field(600.0, ge=0, description="a GPU changed this recently is left alone")
    change_busy_gpus: bool = Field(
        False, description="also plan GPUs that pods hold: the node is cordoned and drained first"
    )
    prefer_mps: bool = Field(
        True,
        description="share under MPS where every share fits its equal part of the GPU (else time-slicing)",
    )

    usage_lookback_minutes: int = Field(
        360,
        ge=1,
        description="minutes of each pod's measured GPU use that time-slicing packs by (B5's window)",
    )
    usage_half_life_minutes: float | None = Field(
        30.0, gt=0, description="an older minute of use counts half as much per half-life; null: all alike"
    )
    usage_overload_budget: float = Field(
        0.008,
        ge=0,
        lt=1,
        description="share of the (weighted) minutes in which pods packed on one GPU may sum over 100 %",
    )
    usage_min_history_minutes: int = Field(
        10, ge=1, description="a pod with fewer minutes of readings is sized by its requested milli"
    )

    def usage(self) -> UsageSettings:
        return UsageSettings(
            lookback_minutes=self.usage_lookback_minutes,
            half_life_minutes=self.usage_half_life_minutes,
            overload_budget=self.usage_overload_budget,
            min_history_minutes=min(self.usage_min_history_minutes, self.usage_lookback_minutes),
        )

    def planner(self) -> PlannerSettings:
        return PlannerSettings(
            reconfigure_minutes=self.reconfigure_minutes,
            benefit_horizon_minutes=self.benefit_horizon_minutes,
            hysteresis_ratio=self.hysteresis_ratio,
            min_dwell_s=self.min_dwell_s,
            change_busy_gpus=self.change_busy_gpus,
            prefer_mps=self.prefer_mps,
            usage=self.usage(),
        )


class SlicingLeaderElection(LeaderElectionSettings):
    """Only one replica plans layouts: the holder of the ``tessera-slicing`` Lease (with a kubeconfig).
    Every replica drives the operations already stored, each node under its own lease in Postgres."""

    lease_name: str = Field("tessera-slicing", min_length=1)


class SlicingSettings(ServiceSettings):
    model_config = service_config("slicing")

    http_port: int = http_port(8084)
    # few events, kept a week for audits
    observed_retention_h: float = observed_retention_h(168.0)
    kubeconfig: Path | None = Field(
        None,
        validation_alias=AliasChoices("TESSERA_SLICING_KUBECONFIG", "TESSERA_KUBECONFIG", "kubeconfig"),
        description="a kubeconfig of the cluster whose GPUs to slice; none: demand is only recorded",
    )
    replica: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}",
        description="this replica's name on the node leases",
    )
    lease_s: float = Field(30.0, gt=0, description="a replica that stops renewing loses a node after this")
    tick_s: float = Field(0.5, gt=0, description="how often open operations and the window are looked at")
    operator_namespace: str = "gpu-operator"
    mig_configmap: str = Field("custom-mig-config", description="the MIG manager's ConfigMap (config.yaml)")
    device_plugin_configmap: str = Field("device-plugin-config", description="the device plugin's ConfigMap")
    events_namespace: str = Field("default", description="where Events about nodes are recorded")
    operations: OperationSettings = OperationSettings()
    planning: PlanningSettings = PlanningSettings()
    leader_election: SlicingLeaderElection = SlicingLeaderElection()


@lru_cache
def get_settings() -> SlicingSettings:
    return SlicingSettings()
