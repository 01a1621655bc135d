"""The durable format: manifest, chunks and checksums, atomic publish, torn and corrupt checkpoints,
retention, and restoring into a state that does not match."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from pathlib import Path
from typing import Any

import crc32c
import fsspec
import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from tessera.checkpoint_client import (
    CheckpointCorrupt,
    Checkpointer,
    ForeignCheckpoint,
    StateMismatch,
    latest_uri,
    load,
)
from tessera.checkpoint_client import store as store_module
from tessera.checkpoint_client.durable import list_checkpoints
from tessera.checkpoint_client.format import FORMAT_VERSION, MANIFEST
from tessera.checkpoint_client.store import LocalStore

JOB = "job-7"


def make_state(seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "model": {
            "w": rng.standard_normal((64, 33)).astype(np.float32),
            "b": rng.standard_normal(33),
            "tiny": np.int16(seed),
        },
        "optim": {"state": {0: {"m": rng.standard_normal(100)}}, "param_groups": [{"lr": 0.1 * (seed + 1)}]},
        "epoch": seed,
    }


def zeros_like(state: dict[str, Any]) -> dict[str, Any]:
    s = make_state(99)
    for leaf in (s["model"]["w"], s["model"]["b"], s["optim"]["state"][0]["m"]):
        leaf[...] = 0
    return s


def save(tmp_path: Path, step: int, state: dict[str, Any] | None = None, **kw: Any) -> Checkpointer:
    ck = Checkpointer(JOB, str(tmp_path), interval_s=None, **kw)
    result = ck.save(step, state or make_state(step), wait=True)
    assert result is not None and result.ok, result
    return ck


def ckpt_dirs(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / JOB).iterdir())


def test_manifest_names_every_tensor_chunk_and_checksum(tmp_path: Path) -> None:
    ck = save(tmp_path, 12, chunk_bytes=4096)
    [directory] = ckpt_dirs(tmp_path)
    assert directory.name.startswith("step-0000000012-")
    manifest = json.loads((directory / MANIFEST).read_text())
    assert manifest["format_version"] == FORMAT_VERSION and manifest["job_id"] == JOB
    assert manifest["step"] == 12 and manifest["created_at"]
    total = manifest["total_bytes"]
    assert total == sum(c["bytes"] for c in manifest["chunks"])
    assert len(manifest["chunks"]) == -(-total // 4096) > 1
    for chunk in manifest["chunks"]:
        data = (directory / chunk["file"]).read_bytes()
        assert len(data) == chunk["bytes"]
        assert chunk["crc32c"] == f"{crc32c.crc32c(data):08x}"
    w = next(t for t in manifest["tensors"] if t["name"] == "model.w")
    assert (w["shape"], w["dtype"], w["nbytes"]) == ([64, 33], "<f4", 64 * 33 * 4)
    assert len(w["pieces"]) > 1  # 8448 bytes over 4096-byte chunks
    raw = b"".join(
        (directory / manifest["chunks"][p["chunk"]]["file"]).read_bytes()[
            p["offset"] : p["offset"] + p["length"]
        ]
        for p in w["pieces"]
    )
    assert np.array_equal(np.frombuffer(raw, np.float32).reshape(64, 33), make_state(12)["model"]["w"])
    assert {o["name"] for o in manifest["objects"]} == {"optim.param_groups", "epoch"}
    assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]
    assert ck.last_result is not None and ck.last_result.size_bytes == total
    ck.close()


def test_data_is_durable_before_the_manifest_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        events.append("fsync:" + os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(src: str, dst: str) -> None:
        events.append(f"rename:{os.path.basename(src)}")
        real_rename(src, dst)

    monkeypatch.setattr(store_module.os, "fsync", fsync)
    monkeypatch.setattr(store_module.os, "rename", rename)
    save(tmp_path, 1, chunk_bytes=8192).close()
    chunks = sorted({e.split(":")[1] for e in events if e.startswith("fsync:data-")})
    assert len(chunks) >= 2
    for name in chunks:  # each chunk: fsync of the temporary file, then its rename
        assert events.index(f"fsync:{name}") < events.index(f"rename:{name}")
    publish = events.index(f"rename:{MANIFEST}.tmp")
    assert events.index(f"fsync:{MANIFEST}.tmp") < publish
    last_rename = max(events.index(f"rename:{name}") for name in chunks)
    assert last_rename < publish
    [directory] = ckpt_dirs(tmp_path)
    # the data renames are durable (their directory fsynced) before the manifest is renamed into place
    assert f"fsync:{directory.name}" in events[last_rename:publish]
    after = events[publish:]
    assert f"fsync:{directory.name}" in after  # the manifest's rename is durable
    assert f"fsync:{JOB}" in after and f"fsync:{tmp_path.name}" in after  # so are the new directories


def test_a_torn_checkpoint_is_skipped_for_the_previous_complete_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    save(tmp_path, 1, keep=5).close()
    save(tmp_path, 2, keep=5).close()
    torn = ckpt_dirs(tmp_path)[-1]
    (torn / MANIFEST).unlink()  # the flush died before publishing
    state = zeros_like(make_state())
    with caplog.at_level(logging.WARNING):
        assert Checkpointer(JOB, str(tmp_path), interval_s=None).restore(state) == 1
    assert torn.name in caplog.text and "torn" in caplog.text
    assert np.array_equal(state["model"]["w"], make_state(1)["model"]["w"])
    assert state["optim"]["param_groups"] == [{"lr": 0.2}] and state["epoch"] == 1
    assert state["model"]["tiny"] == np.int16(1)


def test_an_unparsable_manifest_counts_as_torn(tmp_path: Path) -> None:
    save(tmp_path, 1, keep=5).close()
    save(tmp_path, 2, keep=5).close()
    (ckpt_dirs(tmp_path)[-1] / MANIFEST).write_text('{"format": "tessera-checkpoint", "step": ')
    assert Checkpointer(JOB, str(tmp_path), interval_s=None).restore(zeros_like(make_state())) == 1


def test_a_corrupt_chunk_is_refused_naming_the_file_and_the_state_is_untouched(tmp_path: Path) -> None:
    save(tmp_path, 3, chunk_bytes=4096).close()
    [directory] = ckpt_dirs(tmp_path)
    victim = directory / "data-00001.bin"
    data = bytearray(victim.read_bytes())
    data[10] ^= 0xFF
    victim.write_bytes(bytes(data))
    state = zeros_like(make_state())
    with pytest.raises(CheckpointCorrupt, match=r"data-00001\.bin: checksum mismatch"):
        Checkpointer(JOB, str(tmp_path), interval_s=None).restore(state)
    assert not state["model"]["w"].any() and state["epoch"] == 99


@pytest.mark.parametrize("damage", ["missing", "truncated", "longer"])
def test_a_missing_or_resized_chunk_is_refused_naming_the_file(tmp_path: Path, damage: str) -> None:
    save(tmp_path, 3, chunk_bytes=4096).close()
    victim = ckpt_dirs(tmp_path)[0] / "data-00002.bin"
    if damage == "missing":
        victim.unlink()
    elif damage == "truncated":
        victim.write_bytes(victim.read_bytes()[:-1])
    else:
        victim.write_bytes(victim.read_bytes() + b"\0")
    with pytest.raises(CheckpointCorrupt, match=r"data-00002\.bin"):
        Checkpointer(JOB, str(tmp_path), interval_s=None).restore(zeros_like(make_state()))


def test_a_checkpoint_of_another_job_is_refused(tmp_path: Path) -> None:
    save(tmp_path, 3).close()
    uri = latest_uri(str(tmp_path), JOB)
    assert uri is not None
    with pytest.raises(ForeignCheckpoint, match=r"manifest\.json: checkpoint of job 'job-7', not of 'other'"):
        Checkpointer("other", str(tmp_path), interval_s=None).restore(zeros_like(make_state()), uri=uri)


ODD_IDS = [
    "exp/1",
    "exp:1",
    "exp_1",
    "exp~2F1",
    "exp%2F1",
    "..",
    ".",
    "../x",
    "a b",
    "\u00e9t\u00e9",
    "x" * 60,
]


def test_jobs_with_different_ids_never_share_a_directory_nor_prune_each_other(tmp_path: Path) -> None:
    for n, job in enumerate(ODD_IDS):
        ck = Checkpointer(job, str(tmp_path), interval_s=None, keep=1)
        for step in (10 * n + 1, 10 * n + 2):
            assert (r := ck.save(step, make_state(step), wait=True)) is not None and r.ok, r.reason
        ck.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == len(ODD_IDS) and not {".", ".."} & set(names)
    assert {"exp_1", "x" * 60} <= set(names)  # an id that needs no escaping keeps the name it always had
    assert len(list(tmp_path.glob("*/step-*"))) == len(ODD_IDS)  # one each (keep=1), none outside the root
    for n, job in enumerate(ODD_IDS):
        state = zeros_like(make_state())
        assert Checkpointer(job, str(tmp_path), interval_s=None).restore(state) == 10 * n + 2, job
        assert state["epoch"] == 10 * n + 2
    with pytest.raises(ValueError, match="job_id"):
        Checkpointer("", str(tmp_path), interval_s=None)


def test_a_checkpoint_of_another_job_in_the_directory_is_neither_restored_nor_pruned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Before ids were escaped, `exp/1` wrote into `exp_1`, the directory of the job `exp_1`.
    other = Checkpointer("exp/1", str(tmp_path / "old"), interval_s=None)
    assert (r := other.save(50, make_state(50), wait=True)) is not None and r.ok
    other.close()
    [legacy] = (tmp_path / "old").glob("*/step-*")
    (tmp_path / "exp_1").mkdir()
    shutil.copytree(legacy, tmp_path / "exp_1" / legacy.name)
    ck = Checkpointer("exp_1", str(tmp_path), interval_s=None, keep=1)
    assert ck.restore(zeros_like(make_state())) == 0
    for step in (1, 2, 3):
        assert (r := ck.save(step, make_state(step), wait=True)) is not None and r.ok
    assert (tmp_path / "exp_1" / legacy.name / MANIFEST).exists()
    state = zeros_like(make_state())
    with caplog.at_level(logging.WARNING):
        assert ck.restore(state) == 3
    assert "of job 'exp/1', not of 'exp_1': skipped" in caplog.text and state["epoch"] == 3
    assert [c.step for c in list_checkpoints(LocalStore(str(tmp_path)), "exp_1")] == [3, 50]
    ck.close()


def test_an_unknown_format_version_is_refused(tmp_path: Path) -> None:
    save(tmp_path, 3).close()
    path = ckpt_dirs(tmp_path)[0] / MANIFEST
    doc = json.loads(path.read_text())
    doc["format_version"] = 99
    doc["tensors"] = "something new"
    path.write_text(json.dumps(doc))
    with pytest.raises(ForeignCheckpoint, match=r"manifest\.json: format 'tessera-checkpoint' version 99"):
        Checkpointer(JOB, str(tmp_path), interval_s=None).restore(zeros_like(make_state()))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: s["model"].__setitem__("w", np.zeros((64, 32), np.float32)),
            r"model\.w: shape \(64, 33\)",
        ),
        (
            lambda s: s["model"].__setitem__("b", np.zeros(33, np.float32)),
            r"model\.b: dtype <f8 in the checkpoint",
        ),
        (lambda s: s["model"].__setitem__("extra", np.zeros(1)), r"model\.extra: not in the checkpoint"),
        (lambda s: s["model"].pop("b"), r"model\.b: in the checkpoint but not in the state"),
        (
            lambda s: s["optim"]["state"].pop(0),
            r"optim\.state: empty in the state, the checkpoint holds optim\.state\.0\.m",
        ),
    ],
)
def test_restoring_into_a_state_that_does_not_match_names_the_tensor(
    tmp_path: Path, change: Any, message: str
) -> None:
    save(tmp_path, 3).close()
    state = zeros_like(make_state())
    change(state)
    with pytest.raises(StateMismatch, match=message):
        Checkpointer(JOB, str(tmp_path), interval_s=None).restore(state)
    assert not state["model"]["w"].any()


def test_retention_keeps_the_newest_n_and_deletes_only_after_publishing(tmp_path: Path) -> None:
    ck = Checkpointer(JOB, str(tmp_path), interval_s=None, keep=2)
    leftover = tmp_path / JOB / "step-0000000000-dead"  # a flush that died long ago
    leftover.mkdir(parents=True)
    (leftover / "data-00000.bin.tmp").write_bytes(b"x")
    for step in (1, 2, 3, 4):
        result = ck.save(step, make_state(step), wait=True)
        assert result is not None and result.ok
        names = [d.name for d in ckpt_dirs(tmp_path)]
        assert names[-1].startswith(f"step-{step:010d}")
        assert len(names) == min(step, 2)
    assert [c.step for c in list_checkpoints(LocalStore(str(tmp_path)), JOB)] == [3, 4]
    ck.close()


def test_a_failed_flush_deletes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ck = Checkpointer(JOB, str(tmp_path), interval_s=None, keep=1)
    assert (r := ck.save(1, make_state(1), wait=True)) is not None and r.ok

    def fail(self: LocalStore, directory: str, name: str, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(LocalStore, "publish", fail)
    result = ck.save(2, make_state(2), wait=True)
    assert result is not None and not result.ok and "No space left" in result.reason
    assert [d.name[:15] for d in ckpt_dirs(tmp_path)] == ["step-0000000001"]  # the torn one was removed
    ck.close()


def test_the_uri_from_the_service_wins_over_the_newest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ck = save(tmp_path, 1, keep=5)
    first = ck.last_result.uri if ck.last_result else ""
    ck.save(2, make_state(2), wait=True)
    monkeypatch.setenv("TESSERA_CHECKPOINT_URI", first)
    state = zeros_like(make_state())
    assert ck.restore(state) == 1
    assert np.array_equal(state["model"]["b"], make_state(1)["model"]["b"])
    ck.close()


def test_no_checkpoint_restores_nothing_and_returns_zero(tmp_path: Path) -> None:
    state = make_state(5)
    assert Checkpointer(JOB, str(tmp_path), interval_s=None).restore(state) == 0
    assert state["epoch"] == 5


def test_load_returns_nested_arrays(tmp_path: Path) -> None:
    ck = save(tmp_path, 9)
    assert ck.last_result is not None
    step, tree = load(ck.last_result.uri, job_id=JOB)
    assert step == 9
    assert np.array_equal(tree["model"]["w"], make_state(9)["model"]["w"])
    assert tree["optim"]["state"][0]["m"].shape == (100,)
    assert tree["optim"]["param_groups"] == [{"lr": pytest.approx(1.0)}] and tree["epoch"] == 9
    ck.close()


def test_infinities_and_nan_come_back_as_themselves(tmp_path: Path) -> None:
    inf, nan = float("inf"), float("nan")
    values = {"best": inf, "worst": -inf, "lr": nan, "seq": [1.5, inf, (nan, -inf)], "d": {"x": -inf}}
    ck = save(tmp_path, 5, {**make_state(5), "sched": values}, metadata={"loss": inf})
    ck.close()
    state = {**zeros_like(make_state()), "sched": {**{k: 0.0 for k in values}, "d": {"x": 0.0}}}
    assert Checkpointer(JOB, str(tmp_path), interval_s=None).restore(state) == 5
    got = state["sched"]
    assert got["best"] == inf and got["worst"] == -inf and math.isnan(got["lr"])
    assert got["seq"][:2] == [1.5, inf] and isinstance(got["seq"][2], tuple)
    assert math.isnan(got["seq"][2][0]) and got["seq"][2][1] == -inf and got["d"] == {"x": -inf}
    assert ck.last_result is not None
    _, tree = load(ck.last_result.uri, job_id=JOB)
    assert tree["sched"]["best"] == inf and math.isnan(tree["sched"]["lr"])
    manifest = json.loads((ckpt_dirs(tmp_path)[0] / MANIFEST).read_text())
    assert manifest["metadata"]["loss"] == inf


class KeyedMemory(MemoryFileSystem):
    """An in-memory filesystem that, like an object store, needs its credentials in the options."""

    protocol = ("keyedmem",)
    store: dict[str, Any] = {}  # fsspec's own layout, one per class
    pseudo_dirs = [""]

    def __init__(self, *, key: str | None = None, **kw: Any) -> None:
        if key != "sesame":
            raise PermissionError(f"keyedmem: key {key!r} refused")
        super().__init__(**kw)

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        return super()._strip_protocol(str(path).removeprefix("keyedmem://"))


def test_restoring_or_loading_a_uri_uses_the_storage_options(tmp_path: Path) -> None:
    fsspec.register_implementation("keyedmem", KeyedMemory, clobber=True)
    options = {"key": "sesame"}
    ck = Checkpointer(JOB, f"keyedmem://{tmp_path.name}", interval_s=None, storage_options=options)
    first = ck.save(1, make_state(1), wait=True)
    assert first is not None and first.ok, first.reason
    assert (r := ck.save(2, make_state(2), wait=True)) is not None and r.ok
    state = zeros_like(make_state())
    assert ck.restore(state, uri=first.uri) == 1 and state["epoch"] == 1
    assert load(first.uri, job_id=JOB, storage_options=options)[0] == 1
    with pytest.raises(PermissionError):
        load(first.uri, job_id=JOB)
    ck.close()


def test_any_fsspec_filesystem_works(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    url = f"memory://ckpt-{tmp_path.name}"
    for rename_data in (True, False):
        ck = Checkpointer(JOB, url, interval_s=None, chunk_bytes=4096, keep=1, rename_data=rename_data)
        result = ck.save(4, make_state(4), wait=True)
        assert result is not None and result.ok, result.reason
        assert result.uri.startswith("memory://")
        state = zeros_like(make_state())
        assert ck.restore(state) == 4
        assert np.array_equal(state["optim"]["state"][0]["m"], make_state(4)["optim"]["state"][0]["m"])
        ck.close()
    fs = fsspec.filesystem("memory")
    [directory] = fs.ls(f"/ckpt-{tmp_path.name}/{JOB}", detail=False)
    assert not [f for f in fs.ls(directory, detail=False) if f.endswith(".tmp")]
