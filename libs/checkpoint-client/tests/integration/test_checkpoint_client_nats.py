"""On a real NATS: the service's save command reaches the training loop, the report reaches the stream."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import numpy as np
import pytest
from nats.js import api
from nats.js.errors import NotFoundError

from tessera.checkpoint_client import Checkpointer
from tessera.contracts import subjects
from tessera.contracts.events import ReportCheckpoint, SaveCheckpoint
from tessera.core.messaging.envelope import decode, encode

pytestmark = pytest.mark.integration
STREAM = subjects.stream_name("checkpoint")


class TrainingLoop:
    """A training loop on its own thread calling `step` every few milliseconds."""

    def __init__(self, ckpt: Checkpointer) -> None:
        self.ckpt = ckpt
        self.state = {"model": {"w": np.zeros(50_000, np.float32)}, "epoch": 0}
        self.step = 0
        self.snapshots: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step += 1
            self.state["model"]["w"] += 1
            if self.ckpt.step(self.step, self.state):
                self.snapshots.append(self.step)
            time.sleep(0.005)

    def __enter__(self) -> TrainingLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.ckpt.close()


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Any]:
    client = await nats.connect(nats_url)
    yield client
    await client.drain()


@pytest.fixture
async def checkpoint_stream(nc: Any) -> None:
    """The stream the checkpoint service provisions over `tessera.checkpoint.>`."""
    js = nc.jetstream()
    try:
        await js.stream_info(STREAM)
    except NotFoundError:
        await js.add_stream(
            name=STREAM, subjects=[subjects.stream_subjects("checkpoint")], duplicate_window=120
        )


async def reports_for(js: Any, job_id: str, count: int, timeout: float = 20.0) -> list[ReportCheckpoint]:
    """The job's reports as stored in the stream, read by a pull consumer as the service will."""
    sub = await js.pull_subscribe(
        subjects.REPORT_CHECKPOINT,
        stream=STREAM,
        config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL),
    )
    found: list[ReportCheckpoint] = []
    deadline = time.monotonic() + timeout
    while len(found) < count and time.monotonic() < deadline:
        try:
            msgs = await sub.fetch(10, timeout=0.5)
        except TimeoutError:
            continue
        for msg in msgs:
            await msg.ack()
            report = decode(msg.subject, msg.headers, msg.data).parse()
            assert isinstance(report, ReportCheckpoint)
            if report.job_id == job_id:
                assert msg.headers["Nats-Msg-Id"] == msg.headers["ce-id"]
                found.append(report)
    await sub.unsubscribe()
    return found


def wait_ready(ckpt: Checkpointer) -> None:
    assert ckpt.link is not None and ckpt.link.ready.wait(15), "the NATS listener did not subscribe"


async def test_a_save_command_is_served_at_the_next_step_and_reported_on_the_stream(
    nats_url: str, nc: Any, checkpoint_stream: None, tmp_path: Path
) -> None:
    job = f"job-{uuid.uuid4().hex[:6]}"
    ckpt = Checkpointer(job, str(tmp_path), nats_url, interval_s=None)
    wait_ready(ckpt)
    assert ckpt.link is not None and ckpt.link.mode == "jetstream"
    js = nc.jetstream()
    with TrainingLoop(ckpt) as loop:
        await asyncio.sleep(0.1)
        assert loop.snapshots == []  # nothing is due without a command
        command = SaveCheckpoint(
            job_id=job,
            request_id="req-1",
            reason="preemption",
            deadline=datetime.now(UTC) + timedelta(seconds=30),
        )
        subject, headers, body = encode(command, "tessera-checkpoint")
        assert subject == f"tessera.checkpoint.cmd.save.{job}"
        sent_at_step = loop.step
        await js.publish(subject, body, headers=headers)
        [report] = await reports_for(js, job, 1)
    assert report.request_id == "req-1" and report.outcome == "saved"
    assert len(loop.snapshots) == 1 and loop.snapshots[0] >= sent_at_step
    result = ckpt.last_result
    assert result is not None and result.ok
    assert report.step == loop.snapshots[0] == result.step
    assert report.size_bytes == result.size_bytes == 200_000
    assert report.uri == result.uri and report.uri.startswith("file://")
    assert report.stall_s > 0 and report.flush_s > 0 and report.reason == "requested"
    restored = {"model": {"w": np.zeros(50_000, np.float32)}, "epoch": 0}
    assert Checkpointer(job, str(tmp_path), interval_s=None).restore(restored, uri=report.uri) == report.step
    assert restored["model"]["w"][0] == report.step


async def test_a_periodic_checkpoint_fires_without_a_command(
    nats_url: str, nc: Any, checkpoint_stream: None, tmp_path: Path
) -> None:
    job = f"job-{uuid.uuid4().hex[:6]}"
    ckpt = Checkpointer(job, str(tmp_path), nats_url, interval_s=0.3)
    wait_ready(ckpt)
    with TrainingLoop(ckpt) as loop:
        reports = await reports_for(nc.jetstream(), job, 1)
    assert reports[0].request_id is None and reports[0].outcome == "saved" and reports[0].reason == "periodic"
    assert reports[0].step == loop.snapshots[0]


async def test_a_failed_checkpoint_is_reported_with_its_reason(
    nats_url: str, nc: Any, checkpoint_stream: None, tmp_path: Path
) -> None:
    job = f"job-{uuid.uuid4().hex[:6]}"
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    ckpt = Checkpointer(job, str(blocker / "ckpt"), nats_url, interval_s=None)
    wait_ready(ckpt)
    js = nc.jetstream()
    with TrainingLoop(ckpt):
        command = SaveCheckpoint(
            job_id=job, request_id="req-f", reason="spot_interruption", deadline=datetime.now(UTC)
        )
        subject, headers, body = encode(command, "tessera-checkpoint")
        await js.publish(subject, body, headers=headers)
        [report] = await reports_for(js, job, 1)
    assert report.outcome == "failed" and report.request_id == "req-f"
    assert "NotADirectoryError" in report.reason or "FileExistsError" in report.reason


@pytest.fixture
def no_nats_url() -> Iterator[str]:
    yield "nats://127.0.0.1:1"  # nothing listens there


def test_training_goes_on_when_nats_is_unreachable(no_nats_url: str, tmp_path: Path) -> None:
    ckpt = Checkpointer("job-offline", str(tmp_path), no_nats_url, interval_s=0.1)
    with TrainingLoop(ckpt) as loop:
        time.sleep(0.5)
        assert loop.snapshots, "periodic checkpoints go on without NATS"
    assert ckpt.last_result is not None and ckpt.last_result.ok


async def test_without_a_stream_commands_arrive_over_core_nats(nats_url: str, nc: Any) -> None:
    """No stream captures the subject (no checkpoint service deployed): a core subscription instead."""
    from tessera.checkpoint_client.nats_link import NatsLink

    job = f"job-{uuid.uuid4().hex[:6]}"
    received: list[SaveCheckpoint] = []
    got = threading.Event()

    def on_request(command: SaveCheckpoint) -> None:
        received.append(command)
        got.set()

    link = NatsLink(nats_url, job, on_request, source="test", subject=f"test.nostream.save.{job}")
    link.start()
    try:
        assert await asyncio.to_thread(link.ready.wait, 15)
        assert link.mode == "core"
        command = SaveCheckpoint(job_id=job, request_id="r-core", reason="manual", deadline=datetime.now(UTC))
        _, headers, body = encode(command, "tessera-checkpoint")
        await nc.publish(link.subject, body, headers=headers)
        other = SaveCheckpoint(
            job_id="someone-else", request_id="r-x", reason="manual", deadline=datetime.now(UTC)
        )
        _, headers, body = encode(other, "tessera-checkpoint")
        await nc.publish(link.subject, body, headers=headers)  # not this job's: ignored
        await nc.publish(link.subject, b"not a cloudevent")  # undecodable: ignored
        assert await asyncio.to_thread(got.wait, 10)
        await asyncio.sleep(0.2)  # the two others would have arrived by now
    finally:
        await asyncio.to_thread(link.close)
    assert [c.request_id for c in received] == ["r-core"]
