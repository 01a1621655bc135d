"""The chaos soak's poison goes where a real tenant's publisher sends its submissions: the tenant's
own submit subject (`tessera.admission.cmd.submit_job.<tenant>`), the only one its NATS credentials
allow. On real NATS JetStream."""

from __future__ import annotations

import httpx
import nats
import pytest

from bench import chaos_poison
from tessera.contracts import subjects
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.testing.services import reset_jetstream

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("kind", ["undecodable", "bad_cloudevent", "wrong_type", "oversized"])
async def test_poison_goes_to_the_tenants_submit_subject(nats_url: str, kind: str) -> None:
    await reset_jetstream(nats_url)
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_stream(js, "admission", StreamLimits())
        async with httpx.AsyncClient(base_url="http://unused.invalid") as http:
            injected = await chaos_poison.inject(kind, f"poison-{kind}", nc, http)
        assert injected.ok, injected.detail
        sub = await js.pull_subscribe(
            subjects.ALL_TENANT_SUBMITS, durable=None, stream=subjects.stream_name("admission")
        )
        [msg] = await sub.fetch(1, timeout=5)
        assert msg.subject == subjects.tenant_submit_job(chaos_poison.TENANT) == chaos_poison.SUBJECT
    finally:
        await nc.close()
