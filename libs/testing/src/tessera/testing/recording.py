"""Recording services on real NATS and Postgres: publish what they consume as its owner would, then
prove that what they recorded expires by their retention rules, on a clock the test moves."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import nats
from sqlalchemy import Table, func, select

from tessera.contracts.base import Message
from tessera.core.messaging.envelope import encode
from tessera.core.messaging.streams import ensure_stream
from tessera.core.runner import RunningService
from tessera.core.settings import StreamSettings
from tessera.testing.services import eventually


async def publish_upstream(
    nats_url: str, messages: Sequence[Message], source: str = "tessera/test"
) -> list[str]:
    """Publish `messages` on their owners' streams (created when missing); their event ids, in order."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        for owner in sorted({m.subject().split(".")[1] for m in messages}):
            await ensure_stream(js, owner, StreamSettings().limits())
        ids = []
        for message in messages:
            subject, headers, body = encode(message, source)
            await js.publish(subject, body, headers=headers)
            ids.append(headers["ce-id"])
        return ids
    finally:
        await nc.close()


async def recorded(service: RunningService[Any], table: Table) -> list[tuple[str, datetime]]:
    """(event id, received at) of every row of `table`, oldest first."""
    async with service.ctx.engine.connect() as conn:
        rows = await conn.execute(select(table.c.event_id, table.c.received_at).order_by(table.c.seq))
        return [(row.event_id, row.received_at) for row in rows]


async def count(service: RunningService[Any], table: Table) -> int:
    async with service.ctx.engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


async def record_all(
    service: RunningService[Any], nats_url: str, table: Table, messages: Sequence[Message]
) -> list[str]:
    before = await count(service, table)
    ids = await publish_upstream(nats_url, messages)

    async def all_recorded() -> bool:
        return await count(service, table) == before + len(messages)

    await eventually(all_recorded, what=f"{len(messages)} more rows in {table.fullname}")
    return ids


async def assert_observed_events_expire(
    service: RunningService[Any],
    nats_url: str,
    observed: Table,
    *,
    old: Sequence[Message],
    new: Sequence[Message],
) -> None:
    """Record `old`, then `new`; the inbox rule deletes every inbox row first, and only `old` leaves
    `observed` once the clock passes its retention counted from the moment between the two."""
    old_ids = await record_all(service, nats_url, observed, old)
    new_ids = await record_all(service, nats_url, observed, new)
    rows = dict(await recorded(service, observed))
    last_old, first_new = max(rows[i] for i in old_ids), min(rows[i] for i in new_ids)
    assert last_old < first_new
    inbox, keep_observed_s = service.ctx.inbox, _max_age_s(service, observed)
    messages = len(old) + len(new)
    assert await count(service, inbox) == messages

    async def purged() -> dict[str, int]:
        """What a purge deleted from the inbox and `observed` (a service's other tables have rules of
        their own, and nothing of theirs is recorded here)."""
        deleted = await service.purge()
        return {name: deleted[name] for name in (inbox.fullname, observed.fullname)}

    service.clock = lambda: first_new  # nothing is old yet
    assert await purged() == {inbox.fullname: 0, observed.fullname: 0}

    inbox_kept = timedelta(seconds=service.ctx.settings.retention.inbox_s)
    service.clock = lambda: max(rows.values()) + inbox_kept + timedelta(seconds=1)
    assert await purged() == {inbox.fullname: messages, observed.fullname: 0}

    between = last_old + (first_new - last_old) / 2
    service.clock = lambda: between + timedelta(seconds=keep_observed_s)
    assert await purged() == {inbox.fullname: 0, observed.fullname: len(old)}
    assert [event_id for event_id, _ in await recorded(service, observed)] == new_ids


def _max_age_s(service: RunningService[Any], table: Table) -> float:
    (rule,) = [r for r in service.retention_rules if r.table is table]
    return rule.max_age_s
