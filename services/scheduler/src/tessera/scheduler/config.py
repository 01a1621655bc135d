"""Settings of the scheduler service: env prefix `TESSERA_SCHEDULER_`.

``kubeconfig`` (or the shared ``TESSERA_KUBECONFIG``) points the scheduler at a cluster: it then
watches nodes, pods and PodGroups, creates the pods of admitted jobs and binds through the
Binding API. Without one it places gangs on the inventory telemetry reports (inventory mode).
With a kubeconfig, replicas elect a leader on a Lease (``leader_election``): only it decides.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Self

from pydantic import AliasChoices, BaseModel, Field, model_validator

from tessera.cluster.leader import LeaderElectionConfig
from tessera.core.settings import ServiceSettings, http_port, service_config


class GangSettings(BaseModel):
    """How gangs wait: Permit timeout, exponential backoff, and how long a parked gang may sleep."""

    timeout_s: float = Field(60.0, gt=0, description="quorum wait in Permit before every member is released")
    backoff_initial_s: float = Field(1.0, gt=0)
    backoff_max_s: float = Field(60.0, gt=0)
    max_parked_s: float = Field(300.0, gt=0, description="a parked gang is retried at least this often")


class WorkloadProfileSettings(BaseModel):
    """How the fragmentation score learns its typical workload from the latest placements (ADR 0011)."""

    sample_size: int = Field(
        1000, gt=0, description="how many of the latest placements that hold GPU milli make the sample"
    )
    min_gpu_pods: int = Field(
        50,
        gt=0,
        description="with fewer GPU pods in the sample the openb workload stays: "
        "a handful of jobs must not decide the whole profile",
    )
    refresh_s: float = Field(
        300.0, gt=0, description="the loop learns the workload again this often (a rebuild learns it too)"
    )

    @model_validator(mode="after")
    def _enough_can_be_sampled(self) -> Self:
        if self.min_gpu_pods > self.sample_size:
            raise ValueError(
                f"min_gpu_pods ({self.min_gpu_pods}) exceeds sample_size ({self.sample_size}): "
                "the workload would never be learnt"
            )
        return self


class LeaderElectionSettings(BaseModel):
    """Only one scheduler decides: the holder of a ``coordination.k8s.io/v1`` Lease (with a kubeconfig).

    Followers keep their consumers (they record what arrives) and watch the cluster, but neither
    decide nor bind. kube-scheduler's defaults: 15 s, 10 s, 2 s."""

    enabled: bool = Field(True, description="elect a leader when a kubeconfig is given")
    lease_name: str = Field("tessera-scheduler", min_length=1)
    namespace: str | None = Field(
        None,
        description="where the Lease is kept; default: the pod's own namespace (the release's), "
        "else the scheduler's namespace",
    )
    lease_duration_s: float = Field(
        15.0, gt=0, description="followers take over this long after they last saw the lease renewed"
    )
    renew_deadline_s: float = Field(
        10.0, gt=0, description="the leader stops deciding when it could not renew for this long"
    )
    retry_period_s: float = Field(2.0, gt=0, description="how often candidates try and the leader renews")

    @model_validator(mode="after")
    def _leader_stops_before_another_starts(self) -> Self:
        self.config()  # raises naming the rule a combination breaks
        return self

    def config(self) -> LeaderElectionConfig:
        return LeaderElectionConfig(self.lease_duration_s, self.renew_deadline_s, self.retry_period_s)


class SchedulerSettings(ServiceSettings):
    model_config = service_config("scheduler")

    http_port: int = http_port(8083)
    kubeconfig: Path | None = Field(
        None,
        validation_alias=AliasChoices("TESSERA_SCHEDULER_KUBECONFIG", "TESSERA_KUBECONFIG", "kubeconfig"),
        description="a kubeconfig of the cluster to watch and bind on; none: inventory mode",
    )
    namespace: str = Field("default", min_length=1, description="where the pods of admitted jobs are created")
    gang: GangSettings = GangSettings()
    workload_profile: WorkloadProfileSettings = WorkloadProfileSettings()
    leader_election: LeaderElectionSettings = LeaderElectionSettings()
    poll_s: float = Field(1.0, gt=0, description="the scheduling loop wakes at least this often")
    bind_timeout_s: float = Field(30.0, gt=0)
    cluster_sync_timeout_s: float = Field(30.0, gt=0, description="how long to wait for the first lists")


@lru_cache
def get_settings() -> SchedulerSettings:
    return SchedulerSettings()
