"""A migrated, empty database and an empty JetStream for every system test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tessera.core.db.migrations import migrate_all
from tessera.testing.services import reset_jetstream


@pytest.fixture
async def system(nats_url: str, fresh_database: str) -> AsyncIterator[tuple[str, str]]:
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate_all, fresh_database)
    yield nats_url, fresh_database
