"""The devcluster's workload controllers: Jobs, JobSets, ReplicaSets, Deployments, StatefulSets and
LeaderWorkerSets, and the garbage collector, simulated on the API server's store as
kube-controller-manager (and the LeaderWorkerSet controller manager) run them."""

from __future__ import annotations

import asyncio
import contextlib

from tessera.devcluster.apiserver.store import ObjectStore
from tessera.devcluster.apiserver.webhooks import MutatingWebhooks
from tessera.devcluster.controllers.deployments import DeploymentController
from tessera.devcluster.controllers.garbage import GarbageCollector
from tessera.devcluster.controllers.jobs import JobController
from tessera.devcluster.controllers.jobsets import JobSetController
from tessera.devcluster.controllers.leaderworkersets import LeaderWorkerSetController, LwsControllerContext
from tessera.devcluster.controllers.replicasets import ReplicaSetController
from tessera.devcluster.controllers.statefulsets import StatefulSetController


class WorkloadControllers:
    """All of them, started and stopped together on the API server's event loop."""

    def __init__(self, store: ObjectStore, webhooks: MutatingWebhooks | None) -> None:
        ctx = LwsControllerContext(store, webhooks)
        self.jobs = JobController(ctx)
        self.jobsets = JobSetController(ctx)
        self.replicasets = ReplicaSetController(ctx)
        self.deployments = DeploymentController(ctx)
        self.statefulsets = StatefulSetController(ctx)
        self.leaderworkersets = LeaderWorkerSetController(ctx)
        self.garbage = GarbageCollector(store)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(c.run())
            for c in (
                self.jobs,
                self.jobsets,
                self.replicasets,
                self.deployments,
                self.statefulsets,
                self.leaderworkersets,
                self.garbage,
            )
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []


__all__ = ["WorkloadControllers"]
