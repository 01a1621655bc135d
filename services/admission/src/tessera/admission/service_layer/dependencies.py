"""What admission's handlers, routes and cycle share, built once in `bootstrap.py`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from pydantic import SecretStr

from tessera.admission.config import AdmissionSettings, AuthMode
from tessera.admission.service_layer.ports import WorkloadCluster
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork
from tessera.core.runner import ServiceContext


@dataclass
class AdmissionDeps:
    ctx: ServiceContext
    auth: AuthMode
    admin_token: SecretStr | None
    cycle_interval_s: float
    full_cycle_interval_s: float
    #: the cluster jobs run on, as Kubernetes objects (None: admission only queues)
    workload_cluster: WorkloadCluster | None = None
    namespace: str = "default"
    workload_sync_interval_s: float = 0.5
    #: reconciliation leaves a job that changed more recently than this to its events
    reconcile_grace_s: float = 60.0
    #: set by a submission or a release in this process, so the cycle runs at once
    cycle_wake: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    def from_settings(
        cls, ctx: ServiceContext, settings: AdmissionSettings, workload_cluster: WorkloadCluster | None = None
    ) -> AdmissionDeps:
        return cls(
            ctx=ctx,
            auth=settings.auth,
            admin_token=settings.admin_token,
            cycle_interval_s=settings.cycle_interval_s,
            full_cycle_interval_s=settings.full_cycle_interval_s,
            workload_cluster=workload_cluster,
            namespace=settings.namespace,
            workload_sync_interval_s=settings.workload_sync_interval_s,
            reconcile_grace_s=settings.reconcile_grace_s,
        )

    @property
    def templates_required(self) -> bool:
        """With a cluster to run on, every pod group needs a template: the image to run."""
        return self.workload_cluster is not None

    def uow(self) -> AdmissionUnitOfWork:
        uow: AdmissionUnitOfWork = self.ctx.uow()
        return uow

    def wake_cycle(self) -> None:
        self.cycle_wake.set()
