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

from tessera.cluster.leader_settings import LeaderElectionSettings as SharedLeaderElectionSettings
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


class LeaderElectionSettings(SharedLeaderElectionSettings):
    """Only one scheduler decides: the holder of the ``tessera-scheduler`` Lease (with a kubeconfig).

    Followers keep their consumers (they record what arrives) and watch the cluster, but neither
    decide nor bind."""

    lease_name: str = Field("tessera-scheduler", min_length=1)


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
    kube_connections: int = Field(
        40,
        ge=1,
        description="connections kept open to the API server: the three watches, the lease, the "
        "16 threads of API calls and the 16 binding threads, with room (the client's own default "
        "is 5 per CPU)",
    )
    pipelined_binds: bool = Field(
        True,
        description="decide the next gangs while the binds of those decided are in flight (ADR 0026); "
        "false: bind decided gangs together, then wait for them, before deciding more",
    )
    cluster_sync_timeout_s: float = Field(30.0, gt=0, description="how long to wait for the first lists")


@lru_cache
def get_settings() -> SchedulerSettings:
    return SchedulerSettings()
