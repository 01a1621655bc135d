"""A submission over NATS that can never be handled does not poison admission: it is dead-lettered
once, its sender gets `job_rejected`, and the submissions after it are handled."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from tessera.contracts import subjects
from tessera.contracts.events import JobAccepted, JobRejected, SubmitJob
from tessera.core.messaging.envelope import encode
from tessera.testing.builders import a_job
from tessera.testing.services import eventually, read_messages, read_stream

from .conftest import Api, start_api

pytestmark = pytest.mark.integration


@pytest.fixture
async def submitter(nats_url: str) -> AsyncIterator[NATS]:
    nc = await nats.connect(nats_url)
    yield nc
    await nc.close()


def wire_size(headers: Mapping[str, str] | None, body: bytes) -> int:
    """What the server counts against max_payload: `NATS/1.0` and a line per header, then the body."""
    lines = ["NATS/1.0", *(f"{key}: {value}" for key, value in (headers or {}).items()), ""]
    return (len("\r\n".join(lines).encode()) + 2 if headers else 0) + len(body)


def near_the_limit(job_id: str, limit: int) -> tuple[str, dict[str, str], bytes]:
    """A submission `limit - 64` bytes on the wire whose name (far over 63 characters) no job row
    can hold: published as is it fits, but its dead-letter copy with the reason would not."""
    spec = a_job("x").as_dict()
    _, headers, body = encode(SubmitJob(job_id=job_id, spec={**spec, "name": ""}), "tessera/test")
    spec["name"] = "n" * (limit - 64 - wire_size(headers, body))
    return encode(SubmitJob(job_id=job_id, spec=spec), "tessera/test")


async def test_a_submission_near_1_mib_that_cannot_be_stored_is_rejected_and_admission_keeps_listening(
    admission_db: tuple[str, str], submitter: NATS
) -> None:
    async for api in start_api(*admission_db, auth="disabled"):
        js = submitter.jetstream()
        subject, headers, body = near_the_limit("poison-1", submitter.max_payload)
        await js.publish(subject, body, headers=headers)
        subject, headers, body = encode(SubmitJob(job_id="ok-1", spec=a_job("ok").as_dict()), "tessera/test")
        await js.publish(subject, body, headers=headers)

        async def answered(js: JetStreamContext = js) -> dict[str, str] | None:
            rejected = {
                e.subject: "rejected" for e in await read_stream(js, subjects.JOB_REJECTED, idle_s=0.2)
            }
            accepted = {
                e.subject: "accepted" for e in await read_stream(js, subjects.JOB_ACCEPTED, idle_s=0.2)
            }
            found = {**rejected, **accepted}
            return found if {"poison-1", "ok-1"} <= found.keys() else None

        assert await eventually(answered, timeout=30, what="both submissions answered") == {
            "poison-1": "rejected",
            "ok-1": "accepted",
        }
        rejection = next(
            e.parse() for e in await read_stream(js, subjects.JOB_REJECTED) if e.subject == "poison-1"
        )
        # rejected by validation, or, where the value reaches the database, dead-lettered with the reason
        assert isinstance(rejection, JobRejected) and rejection.errors[0].field in ("name", "message")

        await _still_live(api)
        info = await js.consumer_info("TESSERA_ADMISSION", "admission-submit")
        assert info.num_ack_pending == 0 and info.num_redelivered == 0, "no redelivery loop"
        for letter in await read_messages(js, subjects.dead_letter("admission", "admission-submit")):
            assert wire_size(letter.headers, letter.data) <= submitter.max_payload
            assert (letter.headers or {})["tessera-dlq-deliveries"] == "1"

        # a body of the wrong type is answered the same way, at once
        subject, headers, _ = encode(SubmitJob(job_id="wrong-type", spec={}), "tessera/test")
        await js.publish(subject, b'{"job_id": "wrong-type", "spec": "not an object"}', headers=headers)
        wrong = await eventually(
            lambda js=js: _rejection(js, "wrong-type"), timeout=20, what="the wrong-typed submission rejected"
        )
        assert wrong.errors[0].field == "message" and "undecodable" in wrong.errors[0].reason

        # a later submission is handled too: the connection and the consumer survived
        subject, headers, body = encode(SubmitJob(job_id="ok-2", spec=a_job("ok2").as_dict()), "tessera/test")
        await js.publish(subject, body, headers=headers)
        await eventually(
            lambda js=js: _accepted(js, "ok-2"),
            timeout=20,
            what="ok-2 accepted after the poisoned submission",
        )


async def _accepted(js: JetStreamContext, job_id: str) -> bool:
    stored = await read_stream(js, subjects.JOB_ACCEPTED, idle_s=0.2)
    return any(isinstance(e.parse(), JobAccepted) and e.subject == job_id for e in stored)


async def _rejection(js: JetStreamContext, job_id: str) -> JobRejected | None:
    for envelope in await read_stream(js, subjects.JOB_REJECTED, idle_s=0.2):
        message = envelope.parse()
        if isinstance(message, JobRejected) and message.job_id == job_id:
            return message
    return None


async def _still_live(api: Api) -> None:
    assert api.ctx.nc.is_connected
    health = await api.client.get("/healthz")
    assert health.status_code == 200, health.text
