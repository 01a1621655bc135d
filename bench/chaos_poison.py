"""Poison for bench.chaos: submissions over NATS that can never be handled, and HTTP bodies over the
limit. Each poisoned submission carries a job id of its own, so the soak can check that admission
answered it (a rejected job) and that it never became a job that runs."""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx
from nats.aio.client import Client as NATS

from tessera.contracts import subjects
from tessera.contracts.events import SubmitJob
from tessera.core.messaging.envelope import encode
from tessera.core.messaging.limits import wire_size

KINDS = ("undecodable", "bad_cloudevent", "wrong_type", "oversized", "http_413")
SOURCE = "tessera/bench-chaos"
HTTP_BODY_BYTES = 3 * 1024 * 1024 // 2
"""A body half again over the services' default request limit (1 MiB)."""
TENANT = "chaos"
SUBJECT = subjects.tenant_submit_job(TENANT)
"""Where an external publisher of the tenant sends its submissions (the subject its credentials allow)."""


@dataclass
class Injected:
    kind: str
    job_id: str | None
    """The id the submission asked for (answered with job_rejected), when it names one."""
    ok: bool
    """Sent as meant (for http_413: answered 413)."""
    detail: str = ""


def _spec(name: str) -> dict[str, object]:
    return {
        "name": name,
        "tenant": TENANT,
        "queue": "default",
        "pod_groups": [{"name": "w", "replicas": 1, "cpu": "1", "memory": "1Gi", "gpu": {"count": 1}}],
    }


async def inject(kind: str, job_id: str, nc: NATS, http: httpx.AsyncClient) -> Injected:
    """Send one poison of `kind`; a NATS or HTTP failure is reported, not raised."""
    try:
        if kind == "http_413":
            body = b'{"name": "' + b"x" * HTTP_BODY_BYTES + b'"}'
            reply = await http.post(
                "/v1/jobs",
                content=body,
                headers={"content-type": "application/json", "Idempotency-Key": job_id},
            )
            return Injected(kind, None, reply.status_code == 413, f"HTTP {reply.status_code}")
        _, headers, body = encode(SubmitJob(job_id=job_id, spec=_spec("poison")), SOURCE, event_id=job_id)
        if kind == "undecodable":
            body = b"\xff\xfe{not json" + random.randbytes(64)
        elif kind == "bad_cloudevent":
            headers = {k: v for k, v in headers.items() if k not in ("ce-type", "ce-specversion")}
        elif kind == "wrong_type":
            body = b'{"job_id": "%s", "spec": "not an object"}' % job_id.encode()
        elif kind == "oversized":  # fits as sent, but no job row can hold its name
            spec = _spec("")
            empty = SubmitJob(job_id=job_id, spec=spec).model_dump_json().encode()
            spec["name"] = "n" * (nc.max_payload - 64 - wire_size(headers, empty))
            body = SubmitJob(job_id=job_id, spec=spec).model_dump_json().encode()
        await nc.jetstream().publish(SUBJECT, body, headers=headers, timeout=5)
        answered = kind != "bad_cloudevent"  # without a type nothing says it is a submission
        return Injected(kind, job_id if answered else None, True)
    except Exception as exc:
        return Injected(kind, None, False, f"{type(exc).__name__}: {exc}"[:200])
