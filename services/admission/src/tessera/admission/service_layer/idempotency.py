"""Submissions with an `Idempotency-Key`: a key is its tenant's own. The first submission with a key
makes a job (whose id is the key, unless a job already has that id); a retry with the same key and
the same body answers with that job; the same key with another body is refused (KeyReused). Another
tenant's same key is another key: it never reaches the first tenant's job."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable

from tessera.admission.service_layer.handlers import SubmitResult, submit_job
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork
from tessera.contracts.jobs import JobSpec

ATTEMPTS = 3
"""Rounds a submission may lose to concurrent ones with the same key or job id before it gives up."""


class KeyReused(Exception):
    def __init__(self, key: str, job_id: str) -> None:
        super().__init__(f"Idempotency-Key {key!r} was sent before with another job body (job {job_id})")
        self.key = key
        self.job_id = job_id


def body_digest(spec: JobSpec) -> str:
    """The sha256 of the job as parsed (so key order and spacing in the request do not matter)."""
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


async def _made_before(
    uow: AdmissionUnitOfWork, spec: JobSpec, key: str, digest: str
) -> tuple[SubmitResult | None, bool]:
    """The job this tenant's key made (None when the key is new to the tenant), and whether a job
    has the key as its id."""
    found = await uow.idempotency.find(spec.tenant, key)
    if found is not None:
        made_with, job_id = found
        if made_with != digest:
            raise KeyReused(key, job_id)
        job = await uow.jobs.get(job_id)
        if job is not None:
            return SubmitResult(job.id, job.state, job.errors, duplicate=True), True
    # a job whose id is the key, of the same tenant: made before keys were per tenant, or sent
    # over NATS with that id
    named = await uow.jobs.get(key)
    if named is None or named.tenant != spec.tenant:
        return None, named is not None
    if named.spec is not None and body_digest(named.spec) != digest:
        raise KeyReused(key, named.id)
    return SubmitResult(named.id, named.state, named.errors, duplicate=True), True


async def submit_once(
    units: Callable[[], AdmissionUnitOfWork], spec: JobSpec, key: str, *, templates_required: bool = False
) -> SubmitResult:
    """Submit ``spec`` under the tenant's ``key``, once; commits. Raises KeyReused."""
    digest = body_digest(spec)
    for _ in range(ATTEMPTS):
        async with units() as uow:
            before, key_is_an_id = await _made_before(uow, spec, key, digest)
            if before is not None:
                return before
            job_id = str(uuid.uuid4()) if key_is_an_id else key
            result = await submit_job(spec, uow, job_id, templates_required=templates_required)
            if job_id == key:  # a concurrent submission may have taken the id (a new UUID cannot clash)
                stored = await uow.jobs.get(job_id)
                if stored is None or stored.tenant != spec.tenant:
                    continue  # another tenant's job took the id meanwhile: not ours to answer with
            if not await uow.idempotency.claim(spec.tenant, key, digest, result.job_id):
                continue  # the same key came concurrently and won: answer with its job
            await uow.commit()
            return result
    raise RuntimeError(f"Idempotency-Key {key!r}: {ATTEMPTS} concurrent submissions in a row won the key")
