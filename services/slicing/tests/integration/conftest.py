"""Slicing on real NATS and Postgres beside a devcluster: a migrated fresh database, an empty JetStream,
the scheduler's demand as it would publish it, and the cluster read through the official client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import nats
import pytest
from kubernetes import client
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tessera.cluster.kube import api_client
from tessera.contracts.base import Message
from tessera.core.db.engine import async_url
from tessera.core.db.migrations import migrate
from tessera.slicing.config import SlicingSettings
from tessera.testing.recording import publish_upstream
from tessera.testing.services import read_stream, reset_jetstream, settings_for

#: quick windows, steps and retries, so a test takes seconds; the behaviour is the production one
QUICK: dict[str, Any] = {
    "tick_s": 0.1,
    "lease_s": 5.0,
    "planning": {"window_s": 1.0, "idle_s": 0.2, "min_dwell_s": 0.0},
    "operations": {"backoff_s": 0.3, "max_backoff_s": 1.0, "apply_timeout_s": 30.0, "verify_timeout_s": 10.0},
}


@dataclass
class Stack:
    nats_url: str
    db: str

    def settings(self, kubeconfig: Any, **overrides: Any) -> SlicingSettings:
        return settings_for(
            SlicingSettings, self.nats_url, self.db, kubeconfig=kubeconfig, **{**QUICK, **overrides}
        )

    async def publish(self, *messages: Message) -> None:
        """As the scheduler, telemetry or the forecaster would: on their streams, created when missing."""
        await publish_upstream(self.nats_url, messages)

    async def events(self, subject: str) -> list[Any]:
        nc = await nats.connect(self.nats_url)
        try:
            return [e.parse() for e in await read_stream(nc.jetstream(), subject, idle_s=0.2)]
        finally:
            await nc.close()

    async def rows(self, query: str) -> list[tuple[Any, ...]]:
        engine = create_async_engine(async_url(self.db))
        try:
            async with engine.connect() as conn:
                return [tuple(row) for row in (await conn.execute(text(query))).all()]
        finally:
            await engine.dispose()


@pytest.fixture
async def stack(nats_url: str, fresh_database: str) -> AsyncIterator[Stack]:
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate, "slicing", fresh_database)
    yield Stack(nats_url, fresh_database)


class Kube:
    """The devcluster through the official client, as an operator would look at it."""

    def __init__(self, kubeconfig: Any) -> None:
        self.api = api_client(kubeconfig=str(kubeconfig))
        self.core = client.CoreV1Api(self.api)

    async def node(self, name: str) -> Any:
        return await asyncio.to_thread(self.core.read_node, name)

    async def labels(self, name: str) -> dict[str, str]:
        return dict((await self.node(name)).metadata.labels or {})

    async def allocatable(self, name: str) -> dict[str, str]:
        return dict((await self.node(name)).status.allocatable or {})

    async def create_pod(self, manifest: dict[str, Any]) -> None:
        await asyncio.to_thread(self.core.create_namespaced_pod, "default", manifest)

    async def bind(self, pod: str, node: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod, "namespace": "default"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await asyncio.to_thread(
            self.core.create_namespaced_pod_binding, pod, "default", body, _preload_content=False
        )

    async def phase(self, pod: str) -> str:
        return str((await asyncio.to_thread(self.core.read_namespaced_pod, pod, "default")).status.phase)

    async def events_about(self, node: str) -> list[Any]:
        listing = await asyncio.to_thread(self.core.list_namespaced_event, "default")
        return [e for e in listing.items if e.involved_object and e.involved_object.name == node]

    def close(self) -> None:
        self.api.close()
