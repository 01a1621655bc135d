"""The training loop's side: when a checkpoint is due, staging reuse, what happens while a flush runs,
and failures that must never reach the training loop."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tessera.checkpoint_client import Checkpointer, CheckpointResult
from tessera.checkpoint_client.store import LocalStore
from tessera.contracts.envelope import encode
from tessera.contracts.events import ReportCheckpoint
from tessera.core.messaging.envelope import decode

JOB = "job-3"


def make_state(n: int = 1000) -> dict[str, Any]:
    return {"w": np.arange(n, dtype=np.float32), "nested": {"v": np.ones((7, 3)), "k": 1}}


def test_the_second_snapshot_allocates_nothing_and_reuses_the_same_buffers(tmp_path: Path) -> None:
    ck = Checkpointer(JOB, str(tmp_path), interval_s=None)
    state = make_state()
    ck.save(1, state, wait=True)
    assert ck.pool.allocations == 1
    [staging] = ck.pool._all
    arena, views = staging.arena, list(staging.views)
    state["w"] += 1
    result = ck.save(2, state, wait=True)
    assert result is not None and result.ok
    assert ck.pool.allocations == 1
    [again] = ck.pool._all
    assert again is staging and again.arena is arena
    assert all(a is b for a, b in zip(again.views, views, strict=True))
    ck.close()


def test_prepare_allocates_up_front_so_the_first_snapshot_is_warm(tmp_path: Path) -> None:
    ck = Checkpointer(JOB, str(tmp_path), interval_s=None)
    ck.prepare(make_state())
    assert ck.pool.allocations == 1
    arena = ck.pool._all[0].arena
    assert not arena.any()  # touched once (zeros written), so no page fault is left for the snapshot
    ck.save(1, make_state(), wait=True)
    assert ck.pool.allocations == 1 and ck.pool._all[0].arena is arena
    ck.close()


def test_a_changed_layout_reuses_the_arena_when_it_fits_and_grows_it_when_not(tmp_path: Path) -> None:
    ck = Checkpointer(JOB, str(tmp_path), interval_s=None)
    ck.save(1, make_state(1000), wait=True)
    arena = ck.pool._all[0].arena
    ck.save(2, {"w": np.zeros(10, np.float32)}, wait=True)
    assert ck.pool.allocations == 1 and ck.pool._all[0].arena is arena
    ck.save(3, make_state(100_000), wait=True)
    assert ck.pool.allocations == 2 and ck.pool._all[0].arena.nbytes >= 400_000
    ck.close()


def test_the_snapshot_is_isolated_from_training_that_goes_on(tmp_path: Path) -> None:
    gate = threading.Event()
    ck = Checkpointer(JOB, str(tmp_path), interval_s=None, on_result=lambda r: None)
    with slow_flush(gate):
        state = make_state()
        ck.save(1, state)
        state["w"][:] = -1  # training mutates the state while the flush has not even started
        gate.set()
        ck.wait()
    restored = make_state()
    restored["w"][:] = 0
    assert ck.restore(restored) == 1
    assert np.array_equal(restored["w"], np.arange(1000, dtype=np.float32))
    ck.close()


def test_step_is_a_flag_check_when_nothing_is_due(tmp_path: Path) -> None:
    calls = []

    def state() -> dict[str, Any]:
        calls.append(1)
        return make_state()

    ck = Checkpointer(JOB, str(tmp_path), interval_s=3600)
    started = time.perf_counter()
    for i in range(10_000):
        assert not ck.step(i, state)
    assert not calls  # the state is not even built
    assert (time.perf_counter() - started) / 10_000 < 50e-6
    ck.close()


def test_the_periodic_checkpoint_fires_once_the_interval_elapsed(tmp_path: Path) -> None:
    ck = Checkpointer(JOB, str(tmp_path), interval_s=0.2)
    state = make_state()
    assert not ck.step(1, state)
    time.sleep(0.25)
    assert ck.step(2, state)
    assert not ck.step(3, state)  # the interval starts again
    result = ck.wait()
    assert result is not None and result.ok and result.trigger == "periodic" and result.step == 2
    ck.close()


def test_a_request_is_served_at_the_next_step(tmp_path: Path) -> None:
    ck = Checkpointer(JOB, str(tmp_path), interval_s=None)
    state = make_state()
    assert not ck.step(1, state)
    ck.request("preemption", request_id="r-1")
    ck.request("preemption", request_id="r-1")  # the same request twice is one request
    assert ck.step(2, state)
    assert not ck.step(3, state)
    result = ck.wait()
    assert result is not None and result.trigger == "requested"
    assert [r.request_id for r in result.requests] == ["r-1"]
    ck.close()


SIGNAL_WHILE_LOCKED = """
import os, signal, sys, tempfile
import numpy as np
from tessera.checkpoint_client import Checkpointer
ck = Checkpointer("job-3", tempfile.mkdtemp(), interval_s=None)
signal.signal(signal.SIGUSR1, lambda *a: ck.request("preemption", request_id="sig-1"))
for held in (ck._lock, ck._requested._cond):  # what the training loop's own calls hold for a moment
    with held:
        os.kill(os.getpid(), signal.SIGUSR1)
        for _ in range(100):  # the handler runs here, inside the critical section
            pass
assert ck.step(1, {"w": np.ones(4)})
result = ck.wait()
assert result is not None and result.ok and [r.request_id for r in result.requests] == ["sig-1"], result
ck.close()
print("served")
"""


@pytest.mark.skipif(not hasattr(os, "kill") or os.name != "posix", reason="POSIX signals")
def test_request_from_a_signal_handler_does_not_deadlock_on_a_lock_the_loop_holds() -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", SIGNAL_WHILE_LOCKED], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        pytest.fail("request() from a signal handler deadlocked on a lock the interrupted code held")
    assert done.returncode == 0 and "served" in done.stdout, done.stderr


@contextlib.contextmanager
def slow_flush(gate: threading.Event) -> Iterator[None]:
    """Chunk writes wait for `gate`: a flush that takes as long as the test wants."""
    real = LocalStore.write_chunks

    def write_chunks(self: LocalStore, directory: str, chunks: Any) -> list[int]:
        assert gate.wait(30)
        return real(self, directory, chunks)

    LocalStore.write_chunks = write_chunks  # type: ignore[method-assign]
    try:
        yield
    finally:
        LocalStore.write_chunks = real  # type: ignore[method-assign]


def test_a_due_checkpoint_during_a_flush_is_deferred_not_blocking(tmp_path: Path) -> None:
    gate = threading.Event()
    ck = Checkpointer(JOB, str(tmp_path), interval_s=None)
    state = make_state()
    with slow_flush(gate):
        ck.save(1, state)
        assert ck.busy
        ck.request("preemption", request_id="r-2")
        started = time.perf_counter()
        assert not ck.step(2, state)  # the single staging is being flushed: defer, do not wait
        assert time.perf_counter() - started < 0.05
        assert ck.deferred == 1
        gate.set()
        first = ck.wait()
        assert first is not None and first.step == 1
        assert ck.step(3, state)  # still due, taken at the first step after the flush
        result = ck.wait()
    assert result is not None and result.step == 3 and [r.request_id for r in result.requests] == ["r-2"]
    ck.close()


def test_save_during_a_flush_waits_for_the_staging(tmp_path: Path) -> None:
    gate = threading.Event()
    ck = Checkpointer(JOB, str(tmp_path), interval_s=None)
    with slow_flush(gate):
        ck.save(1, make_state())
        done = threading.Event()
        threading.Thread(target=lambda: (ck.save(2, make_state()), done.set())).start()
        assert not done.wait(0.2)
        gate.set()
        assert done.wait(10)
        ck.wait()
    assert [r.step for r in ck.results] == [1, 2]
    ck.close()


def test_two_buffers_take_a_snapshot_during_a_flush(tmp_path: Path) -> None:
    gate = threading.Event()
    ck = Checkpointer(JOB, str(tmp_path), interval_s=None, buffers=2, keep=5)
    with slow_flush(gate):
        ck.save(1, make_state())
        ck.request("manual")
        assert ck.step(2, make_state())
        assert ck.pool.allocations == 2
        gate.set()
        ck.wait()
    assert [(r.step, r.ok) for r in ck.results] == [(1, True), (2, True)]
    ck.close()


def read_only(path: Path) -> contextlib.AbstractContextManager[None]:
    """The directory made unwritable for real: mode 0555, or the immutable attribute for root."""

    @contextlib.contextmanager
    def cm() -> Iterator[None]:
        os.chmod(path, 0o555)
        immutable = False
        if os.geteuid() == 0:
            if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)]).returncode != 0:
                os.chmod(path, 0o755)
                pytest.skip("running as root without the immutable attribute: no way to make a read-only dir")
            immutable = True
        try:
            yield
        finally:
            if immutable:
                subprocess.run(["chattr", "-i", str(path)], check=True)
            os.chmod(path, 0o755)

    return cm()


def test_a_read_only_directory_fails_the_flush_not_the_training(tmp_path: Path) -> None:
    seen: list[CheckpointResult] = []
    root = tmp_path / "ro"
    root.mkdir()
    ck = Checkpointer(JOB, str(root), interval_s=None, on_result=seen.append)
    state = make_state()
    with read_only(root):
        ck.request("preemption", request_id="r-ro")
        assert ck.step(1, state)  # returns at once; the failure is the flush's
        result = ck.wait()
    assert result is not None and not result.ok
    assert "Permission" in result.reason or "not permitted" in result.reason
    assert seen == [result] and ck.last_result is result
    again = ck.save(2, state, wait=True)
    assert again is not None and again.ok
    ck.close()


def test_a_full_disk_fails_the_flush_and_the_next_checkpoint_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = LocalStore.write_chunks
    full = True

    def write_chunks(self: LocalStore, directory: str, chunks: Any) -> list[int]:
        if full:
            raise OSError(28, "No space left on device")
        return real(self, directory, chunks)

    monkeypatch.setattr(LocalStore, "write_chunks", write_chunks)
    ck = Checkpointer(JOB, str(tmp_path), interval_s=None)
    result = ck.save(1, make_state(), wait=True)
    assert result is not None and not result.ok and "No space left on device" in result.reason
    assert not (tmp_path / JOB).exists() or not list((tmp_path / JOB).iterdir())  # the torn dir is gone
    full = False
    result = ck.save(2, make_state(), wait=True)
    assert result is not None and result.ok
    ck.close()


def test_an_unknown_storage_url_fails_each_flush_with_the_reason(tmp_path: Path) -> None:
    ck = Checkpointer(JOB, "nosuchproto://bucket/ckpt", interval_s=None)
    ck.request("periodic")
    assert ck.step(1, make_state())
    result = ck.wait()
    assert result is not None and not result.ok
    assert "nosuchproto" in result.reason and "unavailable" in result.reason
    ck.close()


def test_vanished_storage_fails_the_flush(tmp_path: Path) -> None:
    root = tmp_path / "mnt"
    root.mkdir()
    ck = Checkpointer(JOB, str(root / "ckpt"), interval_s=None)
    assert (r := ck.save(1, make_state(), wait=True)) is not None and r.ok
    shutil.rmtree(root)
    root.write_text("the mount is gone")  # where the directory was, now a file
    result = ck.save(2, make_state(), wait=True)
    assert result is not None and not result.ok and "Error" in result.reason
    ck.close()


def test_a_failing_callback_does_not_stop_the_flush_thread(tmp_path: Path) -> None:
    def boom(result: CheckpointResult) -> None:
        raise RuntimeError("callback bug")

    ck = Checkpointer(JOB, str(tmp_path), interval_s=None, on_result=boom)
    assert (r := ck.save(1, make_state(), wait=True)) is not None and r.ok
    assert (r := ck.save(2, make_state(), wait=True)) is not None and r.ok
    ck.close()


def test_a_negative_step_is_refused_naming_step(tmp_path: Path) -> None:
    ck = Checkpointer(JOB, str(tmp_path), interval_s=0)
    with pytest.raises(ValueError, match="step must be 0 or more, not -1"):
        ck.save(-1, make_state())
    with pytest.raises(ValueError, match="step must be 0 or more, not -2"):
        ck.step(-2, make_state())
    assert ck.pool.free_count() == 1 and ck.last_result is None
    ck.close()


class FailingLink:
    """A NATS link whose every report fails."""

    def __init__(self) -> None:
        self.calls = 0

    def report(self, report: ReportCheckpoint, checkpoint_id: str) -> None:
        self.calls += 1
        raise RuntimeError("report bug")

    def close(self) -> None:
        pass


def test_an_unexpected_error_in_the_flush_thread_fails_that_checkpoint_not_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ck = Checkpointer(JOB, str(tmp_path), interval_s=None)
    ck.link = FailingLink()  # type: ignore[assignment]
    real = ck._flush
    calls = 0

    def flush_once_broken(job: Any) -> CheckpointResult:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KeyError("bug")
        return real(job)

    monkeypatch.setattr(ck, "_flush", flush_once_broken)
    ck.save(1, make_state())
    first = ck.wait(timeout=10)
    assert first is not None and first.step == 1 and not first.ok
    assert first.reason == "internal error: KeyError: 'bug'"
    for step in (2, 3):  # each report fails too
        ck.save(step, make_state())
        result = ck.wait(timeout=10)
        assert result is not None and result.step == step and result.ok, result
    assert ck.link.calls == 3  # type: ignore[attr-defined]
    ck.close(timeout=10)


def test_close_waits_for_the_last_flush(tmp_path: Path) -> None:
    ck = Checkpointer(JOB, str(tmp_path), interval_s=None)
    ck.save(1, make_state(200_000))
    ck.close()
    assert ck.last_result is not None and ck.last_result.ok


def test_core_decodes_what_the_client_publishes() -> None:
    report = ReportCheckpoint(
        job_id=JOB,
        request_id="r",
        outcome="saved",
        step=3,
        size_bytes=10,
        uri="file:///x",
        at=datetime.now(UTC),
    )
    subject, headers, body = encode(report, "tessera-checkpoint-client/job-3", event_id="id-1")
    envelope = decode(subject, headers, body)
    assert subject == "tessera.checkpoint.cmd.report_checkpoint" and headers["Nats-Msg-Id"] == "id-1"
    assert envelope.parse() == report


def test_a_flush_that_failed_after_creating_its_directory_does_not_spoil_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = LocalStore.publish
    fail = True

    def publish(self: LocalStore, directory: str, name: str, data: bytes) -> None:
        if fail:
            raise OSError(5, "Input/output error")
        real(self, directory, name, data)

    monkeypatch.setattr(LocalStore, "publish", publish)
    ck = Checkpointer(JOB, str(tmp_path / "new" / "root"), interval_s=None)
    result = ck.save(1, make_state(), wait=True)
    assert result is not None and not result.ok and "Input/output error" in result.reason
    fail = False
    result = ck.save(2, make_state(), wait=True)
    assert result is not None and result.ok, result.reason
    ck.close()
