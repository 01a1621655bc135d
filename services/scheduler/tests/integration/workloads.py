"""What admission does on the cluster for an admitted job, for tests that publish `job_admitted`
themselves: the job's Indexed Jobs and headless Service, unsuspended, so the Job controller creates
the pods the scheduler then places."""

from __future__ import annotations

from pathlib import Path

from tessera.admission.adapters.kube import KubeWorkloads
from tessera.admission.domain.kube_objects import job_objects
from tessera.cluster.kube import api_client
from tessera.contracts.jobs import JobSpec


async def run_workloads(kubeconfig: Path, job_id: str, spec: JobSpec, namespace: str = "default") -> None:
    objects = job_objects(job_id, spec, namespace)
    cluster = KubeWorkloads(api_client(kubeconfig=str(kubeconfig)))
    await cluster.create(objects)
    await cluster.set_suspended(namespace, [job["metadata"]["name"] for job in objects.jobs], False)
