"""Submissions of one tenant on `tessera.admission.cmd.submit_job.<tenant>`.

External publishers hold NATS credentials for their tenant's subject alone (see
`tessera.core.messaging.permissions`); admission checks the other half: a spec naming another tenant
is refused for good, so it is dead-lettered with the reason and its sender gets `job_rejected`. A job
id that another tenant's job holds is refused too (dead-lettered with the reason; the job that holds
it is left alone).
"""

from __future__ import annotations

import functools

from tessera.admission.service_layer.dead_letters import reject_dead_lettered_submit
from tessera.admission.service_layer.handlers import handle_submit_command
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork
from tessera.contracts import subjects
from tessera.core.messaging.consumer import ConsumerSpec, PermanentError
from tessera.core.messaging.envelope import Envelope

CONSUMER = "admission-tenant-submit"


def subject_tenant(nats_subject: str) -> str:
    """The tenant a submit subject names (its last token)."""
    prefix = subjects.SUBMIT_JOB + "."
    if not nats_subject.startswith(prefix) or "." in nats_subject[len(prefix) :]:
        raise PermanentError(
            f"{nats_subject!r} is not a tenant's submit subject ({subjects.ALL_TENANT_SUBMITS})"
        )
    return nats_subject[len(prefix) :]


async def handle_tenant_submit(
    envelope: Envelope, uow: AdmissionUnitOfWork, *, templates_required: bool = False
) -> None:
    tenant = subject_tenant(envelope.nats_subject)
    spec = envelope.data.get("spec")
    named = spec.get("tenant") if isinstance(spec, dict) else None
    if named != tenant:
        raise PermanentError(
            f"spec.tenant {named!r} is not {tenant!r}, the tenant of subject {envelope.nats_subject}: "
            "a tenant's subject takes that tenant's jobs only"
        )
    # The id is the sender's choice: one another tenant's job already holds is refused, where it
    # was answered as that job's resubmission and the sender's job silently dropped (ids could be
    # squatted). The sender's own resubmissions are still idempotent.
    job_id = envelope.data.get("job_id") or envelope.id
    existing = await uow.jobs.get(job_id) if isinstance(job_id, str) else None
    if existing is not None and existing.tenant and existing.tenant != tenant:
        raise PermanentError(f"job_id {job_id!r} is taken by another tenant's job: choose another id")
    await handle_submit_command(envelope, uow, templates_required=templates_required)


def tenant_submit_consumer(templates_required: bool) -> ConsumerSpec[AdmissionUnitOfWork]:
    handler = (
        functools.partial(handle_tenant_submit, templates_required=True)
        if templates_required
        else handle_tenant_submit
    )
    return ConsumerSpec(
        CONSUMER,
        "admission",
        subjects.ALL_TENANT_SUBMITS,
        handler,
        on_dead_letter=reject_dead_lettered_submit,
    )
