"""Answering the sender of a submission that can never be handled."""

from __future__ import annotations

from tessera.admission.domain.model import Job
from tessera.admission.service_layer.handlers import now
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork
from tessera.contracts.base import FieldError
from tessera.core.messaging.consumer import DeadLetter

#: the jobs table's id column
MAX_JOB_ID = 64


async def reject_dead_lettered_submit(letter: DeadLetter, uow: AdmissionUnitOfWork) -> None:
    """A submission that is dead-lettered (too large, undecodable, a value the database refuses)
    still gets `job_rejected` with the reason, under the job id its sender chose: the command's,
    carried as `ce-subject`, else the message id. A job already known under that id is left alone."""
    job_id = letter.headers.get("ce-subject") or letter.message_id
    if not job_id or len(job_id) > MAX_JOB_ID or not job_id.isprintable():
        return
    if await uow.jobs.get(job_id) is not None:
        return
    reason = letter.reason.replace("\x00", "")
    job = Job.reject(job_id, {}, [FieldError(field="message", reason=reason)], now())
    if letter.envelope is not None:
        job.trace_headers = dict(letter.envelope.trace_headers)
    await uow.jobs.add(job)
