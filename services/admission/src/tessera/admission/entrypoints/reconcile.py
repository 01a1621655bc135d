"""Reconciliation, a background task of the service (`service_layer.reconcile`). It runs only when
admission has a cluster to compare its jobs with."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry, Counter

from tessera.admission.domain.reconcile import Repair
from tessera.admission.service_layer.dependencies import AdmissionDeps
from tessera.admission.service_layer.ports import WorkloadCluster, WorkloadError
from tessera.admission.service_layer.reconcile import Repaired, reconcile
from tessera.core.waits import wait_any

log = logging.getLogger(__name__)

INTERVAL_S = 30.0
"""Seconds between passes: a safety net under the events, not their replacement."""


class Reconciliation:
    """Passes of reconciliation with the cluster, each repair counted by kind on ``registry``."""

    def __init__(
        self, deps: AdmissionDeps, cluster: WorkloadCluster, registry: CollectorRegistry, grace: timedelta
    ) -> None:
        self.deps, self.cluster, self.grace = deps, cluster, grace
        self.repairs = Counter(
            "tessera_admission_reconcile_repairs_total",
            "Jobs repaired by reconciliation with the cluster, by repair (running, succeeded, failed, recreate)",
            ["repair"],
            registry=registry,
        )
        for repair in Repair:
            self.repairs.labels(repair.value)  # every repair shows, at 0, before it first happens

    async def run_pass(self) -> list[Repaired]:
        done = await reconcile(self.deps.uow, self.cluster, datetime.now(UTC), self.grace)
        for repaired in done:
            self.repairs.labels(repaired.repair.value).inc()
        if done:
            self.deps.wake_cycle()  # freed quota may admit the next job
        return done


async def reconciliation(deps: AdmissionDeps) -> None:
    cluster = deps.workload_cluster
    if cluster is None:
        return
    grace = timedelta(seconds=deps.reconcile_grace_s)
    passes = Reconciliation(deps, cluster, deps.ctx.metrics.registry, grace)
    while not deps.ctx.stop.is_set():
        try:
            await passes.run_pass()
        except WorkloadError as error:
            log.warning("reconciliation skipped: the API did not answer: %s", error)
        except Exception:
            log.exception("reconciliation pass failed; it runs again")
        await wait_any(deps.ctx.stop, timeout=INTERVAL_S)
