"""Leader-election settings shared by the services that elect a leader on a Lease (the scheduler,
slicing), and the elector they build from them with a kubeconfig. See ADR 0018."""

from __future__ import annotations

from typing import Self

from kubernetes.client import ApiClient
from pydantic import BaseModel, Field, model_validator

from tessera.cluster.kube.lease import KubernetesLeaseLock
from tessera.cluster.leader import LeaderElectionConfig, LeaderElector, default_identity, pod_namespace


class LeaderElectionSettings(BaseModel):
    """Only the holder of a ``coordination.k8s.io/v1`` Lease acts (with a kubeconfig); the other replicas
    stand by and take over once it stops renewing. kube-scheduler's defaults: 15 s, 10 s, 2 s.
    Each service subclasses it to name its own Lease."""

    enabled: bool = Field(True, description="elect a leader when a kubeconfig is given")
    lease_name: str = Field(..., min_length=1)
    namespace: str | None = Field(
        None,
        description="where the Lease is kept; default: the pod's own namespace (the release's), "
        "else the service's namespace",
    )
    lease_duration_s: float = Field(
        15.0, gt=0, description="followers take over this long after they last saw the lease renewed"
    )
    renew_deadline_s: float = Field(
        10.0, gt=0, description="the leader stops acting when it could not renew for this long"
    )
    retry_period_s: float = Field(2.0, gt=0, description="how often candidates try and the leader renews")

    @model_validator(mode="after")
    def _leader_stops_before_another_starts(self) -> Self:
        self.config()  # raises naming the rule a combination breaks
        return self

    def config(self) -> LeaderElectionConfig:
        return LeaderElectionConfig(self.lease_duration_s, self.renew_deadline_s, self.retry_period_s)


def leader_elector(
    api: ApiClient, election: LeaderElectionSettings, default_namespace: str
) -> LeaderElector | None:
    """The elector for these settings (None when election is off)."""
    if not election.enabled:
        return None
    namespace = election.namespace or pod_namespace(default_namespace)
    lock = KubernetesLeaseLock(api, namespace, election.lease_name)
    return LeaderElector(lock, default_identity(), election.config())
