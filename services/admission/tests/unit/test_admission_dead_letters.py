"""A submission that is dead-lettered still answers its sender: `job_rejected` under the job id it
chose, with the reason; a known job is left alone, and an id no job row can hold is not used."""

from __future__ import annotations

from typing import Any

from tessera.admission.domain.model import JobState
from tessera.admission.service_layer.dead_letters import reject_dead_lettered_submit
from tessera.contracts.events import JobRejected, SubmitJob
from tessera.core.messaging.consumer import DeadLetter
from tessera.testing.builders import a_job, an_envelope


def letter(headers: dict[str, str], *, envelope: Any = None, reason: str = "too large") -> DeadLetter:
    return DeadLetter("admission-submit", headers.get("ce-id", "m-1"), headers, envelope, "too_large", reason)


async def reject(uow: Any, dead: DeadLetter) -> None:
    async with uow:
        await reject_dead_lettered_submit(dead, uow)
        await uow.commit()


async def test_the_sender_gets_job_rejected_under_its_job_id_with_the_reason(uow: Any) -> None:
    envelope = an_envelope(SubmitJob(job_id="mine", spec=a_job("x").as_dict()))
    await reject(uow, letter(dict(envelope.headers), envelope=envelope, reason="can never be handled: \x00x"))
    job = uow.job("mine")
    assert job.state is JobState.REJECTED
    (event,) = uow.events_of(JobRejected)
    assert event.job_id == "mine" and event.errors[0].field == "message"
    assert event.errors[0].reason == "can never be handled: x", "a NUL byte is not stored"


async def test_without_a_job_id_the_message_id_names_the_job(uow: Any) -> None:
    await reject(uow, letter({"ce-id": "msg-7"}))
    assert uow.job("msg-7").state is JobState.REJECTED


async def test_a_known_job_and_an_unusable_id_are_left_alone(uow: Any) -> None:
    await reject(uow, letter({"ce-subject": "known", "ce-id": "m-1"}))
    await reject(uow, letter({"ce-subject": "known", "ce-id": "m-2"}, reason="again"))
    await reject(uow, letter({"ce-subject": "j" * 65, "ce-id": "m-3"}))
    assert [e.job_id for e in uow.events_of(JobRejected)] == ["known"]
    assert uow.job("known").errors[0].reason == "too large"
