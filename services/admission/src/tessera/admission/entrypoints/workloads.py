"""A background task of the service: users' labelled Jobs, gated Pods and the groups of
LeaderWorkerSets become jobs (`service_layer.native_jobs`, `service_layer.native_pods`,
`service_layer.native_lws`, which also releases a group's pods when its job is admitted),
jobs' Kubernetes objects follow their states (`service_layer.workload_sync`) and carry their
conditions (`service_layer.job_conditions`). It runs only when admission has a cluster to run jobs
on."""

from __future__ import annotations

import logging

from tessera.admission.service_layer.dependencies import AdmissionDeps
from tessera.admission.service_layer.job_conditions import sync_conditions
from tessera.admission.service_layer.native_jobs import adopt_native_jobs
from tessera.admission.service_layer.native_lws import LwsCluster, sync_lws_groups
from tessera.admission.service_layer.native_pods import adopt_native_pods
from tessera.admission.service_layer.workload_sync import sync_workloads
from tessera.core.waits import wait_any

log = logging.getLogger(__name__)


async def workload_sync(deps: AdmissionDeps) -> None:
    cluster = deps.workload_cluster
    if cluster is None:
        return
    refused: set[str] = set()  # jobs whose change the cluster refused: tried after the others
    while not deps.ctx.stop.is_set():
        try:
            adopted = await adopt_native_jobs(deps.uow, cluster)
            adopted += await adopt_native_pods(deps.uow, cluster)
            if isinstance(cluster, LwsCluster):
                adopted += await sync_lws_groups(deps.uow, cluster)
            if adopted:
                deps.wake_cycle()
            done = await sync_workloads(deps.uow, cluster, deps.namespace, refused=refused)
            done += await sync_conditions(deps.uow, cluster)
            if done:
                continue  # more may be due
        except Exception:
            log.exception("job objects round failed; it runs again")
        await wait_any(deps.ctx.stop, timeout=deps.workload_sync_interval_s)
