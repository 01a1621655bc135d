"""The checkpoint service on real NATS and Postgres: a migrated fresh database, an empty JetStream,
what admission and the scheduler would publish, and a real training loop with the checkpoint client."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import numpy as np
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tessera.checkpoint.config import CheckpointSettings
from tessera.checkpoint_client import Checkpointer
from tessera.contracts.base import Message
from tessera.core.db.engine import async_url
from tessera.core.db.migrations import migrate
from tessera.testing.recording import publish_upstream
from tessera.testing.services import read_stream, reset_jetstream, settings_for


@dataclass
class Stack:
    nats_url: str
    db: str

    def settings(self, **overrides: Any) -> CheckpointSettings:
        return settings_for(CheckpointSettings, self.nats_url, self.db, deadline_poll_s=0.2, **overrides)

    async def publish(self, *messages: Message) -> None:
        """As admission and the scheduler would: on their streams, created when missing."""
        await publish_upstream(self.nats_url, messages)

    async def events(self, subject: str, *, idle_s: float = 0.2) -> list[Any]:
        """Every message stored under `subject`, parsed."""
        nc = await nats.connect(self.nats_url)
        try:
            return [e.parse() for e in await read_stream(nc.jetstream(), subject, idle_s=idle_s)]
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
    await asyncio.to_thread(migrate, "checkpoint", fresh_database)
    yield Stack(nats_url, fresh_database)


class Trainer:
    """A training loop on its own thread that calls `Checkpointer.step` every few milliseconds."""

    def __init__(self, job_id: str, storage: Path, nats_url: str) -> None:
        self.ckpt = Checkpointer(job_id, storage.as_uri(), nats_url, interval_s=None)
        self.state = {"model": {"w": np.zeros(10_000, np.float32)}, "epoch": 0}
        self.step = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"trainer-{job_id}", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step += 1
            self.state["model"]["w"] += 1
            self.ckpt.step(self.step, self.state)
            time.sleep(0.005)

    def connect(self) -> Trainer:
        assert self.ckpt.link is not None and self.ckpt.link.ready.wait(15), "the client did not subscribe"
        assert self.ckpt.link.mode == "jetstream", "it listens on the checkpoint service's stream"
        return self

    def run(self) -> Trainer:
        """Start training: a checkpoint asked for is taken at the next step."""
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.ckpt.close()


@pytest.fixture
def trainers(stack: Stack, tmp_path: Path) -> Iterator[Any]:
    started: list[Trainer] = []

    async def start(job_id: str, *, run: bool = True) -> Trainer:
        """A trainer listening for save commands; training (stepping) unless `run` is False."""
        trainer = await asyncio.to_thread(Trainer, job_id, tmp_path / "ckpt", stack.nats_url)
        started.append(trainer)
        await asyncio.to_thread(trainer.connect)
        return trainer.run() if run else trainer

    yield start
    for trainer in started:
        trainer.stop()
