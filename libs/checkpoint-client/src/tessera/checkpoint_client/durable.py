"""Writing, finding, verifying and pruning checkpoints in a `Store`, in the format of `format.py`."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import crc32c
import numpy as np
from pydantic import ValidationError

from tessera.checkpoint_client.errors import CheckpointCorrupt, ForeignCheckpoint
from tessera.checkpoint_client.format import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    TMP_SUFFIX,
    Chunk,
    Manifest,
    ObjectEntry,
    TensorEntry,
    chunk_name,
    dir_name,
    effective_chunk_bytes,
    parse_dir_name,
    pieces_for,
)
from tessera.checkpoint_client.store import Store
from tessera.checkpoint_client.tree import Bytes, Key, LeafInfo

log = logging.getLogger(__name__)
_SAFE = re.compile(r"[A-Za-z0-9_.-]+")
_KEEP = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


def job_dir_name(job_id: str) -> str:
    """The job's directory under the root: one path component, a different one for every job id.

    An id made only of letters, digits, `_`, `.` and `-` (not `.` or `..`) is its own name, as it
    always was, so existing checkpoints are found. Any other id is escaped: each byte of its UTF-8 that
    is not one of those characters becomes `~XX` (uppercase hex), and so does every `.` of `.` and `..`.
    `~` is escaped itself and never in a plain name, so no two ids share a directory (`exp/1` is
    `exp~2F1`, `exp:1` is `exp~3A1`, `exp_1` is `exp_1`) and none leaves the root."""
    if not job_id:
        raise ValueError("job_id must not be empty")
    if _SAFE.fullmatch(job_id) and job_id not in (".", ".."):
        return job_id
    keep = _KEEP - {"."} if job_id in (".", "..") else _KEEP
    return "".join(chr(b) if chr(b) in keep else f"~{b:02X}" for b in job_id.encode("utf-8", "surrogatepass"))


def job_dir(store: Store, job_id: str) -> str:
    return store.join(store.root, job_dir_name(job_id))


@dataclass(frozen=True)
class TensorRecord:
    """What the flush needs of a tensor: no reference to the live state."""

    name: str
    path: tuple[Key, ...]
    info: LeafInfo
    offset: int


@dataclass(frozen=True)
class Written:
    uri: str
    path: str
    total_bytes: int
    manifest: Manifest


def write_checkpoint(
    store: Store,
    *,
    job_id: str,
    step: int,
    checkpoint_id: str,
    arena: Bytes,
    tensors: Sequence[TensorRecord],
    objects: Sequence[tuple[str, tuple[Key, ...], Any]],
    chunk_bytes: int,
    metadata: dict[str, Any] | None = None,
) -> Written:
    """Data chunks first (durable, renamed into place), then the manifest, whose rename commits."""
    directory = store.join(job_dir(store, job_id), dir_name(step, checkpoint_id))
    store.makedirs(directory)
    total = int(arena.nbytes)
    chunk_bytes = effective_chunk_bytes(total, chunk_bytes)
    chunks = [
        (chunk_name(i), memoryview(arena[start : start + chunk_bytes]))  # type: ignore[arg-type]
        for i, start in enumerate(range(0, total, chunk_bytes))
    ]
    crcs = store.write_chunks(directory, chunks)
    manifest = Manifest(
        format=FORMAT,
        format_version=FORMAT_VERSION,
        job_id=job_id,
        step=step,
        checkpoint_id=checkpoint_id,
        created_at=datetime.now(UTC),
        total_bytes=total,
        chunk_bytes=chunk_bytes,
        chunks=[
            Chunk(file=name, bytes=len(data), crc32c=f"{crc:08x}")
            for (name, data), crc in zip(chunks, crcs, strict=True)
        ],
        tensors=[
            TensorEntry(
                name=t.name,
                path=list(t.path),
                shape=list(t.info.shape),
                dtype=t.info.dtype,
                kind=t.info.kind,
                nbytes=t.info.nbytes,
                offset=t.offset,
                pieces=pieces_for(t.offset, t.info.nbytes, chunk_bytes),
            )
            for t in tensors
        ],
        objects=[ObjectEntry(name=name, path=list(path), value=value) for name, path, value in objects],
        metadata=metadata or {},
    )
    store.publish(directory, MANIFEST, manifest.model_dump_json(indent=1).encode())
    return Written(store.uri(directory), directory, total, manifest)


@dataclass(frozen=True)
class Listed:
    step: int
    checkpoint_id: str
    path: str
    complete: bool


def list_checkpoints(store: Store, job_id: str) -> list[Listed]:
    """The job's checkpoint directories, oldest first; `complete` when the manifest is in place."""
    root = job_dir(store, job_id)
    out = []
    for name in store.listdir(root):
        parsed = parse_dir_name(name)
        if parsed is None:
            continue
        path = store.join(root, name)
        out.append(Listed(parsed[0], parsed[1], path, store.exists(store.join(path, MANIFEST))))
    return sorted(out, key=lambda c: (c.step, c.checkpoint_id))


def read_manifest(store: Store, directory: str, job_id: str | None) -> Manifest:
    """The checkpoint's manifest, checked: ours (job, format), and consistent with its own numbers."""
    path = store.join(directory, MANIFEST)
    raw = store.read_bytes(path)
    if raw is None:
        raise CheckpointCorrupt(path, "no manifest: the checkpoint is torn (its flush never finished)")
    try:
        head = Manifest.model_validate_json(raw) if raw.strip().startswith(b"{") else None
    except ValidationError as exc:
        fmt = _peek(raw, "format"), _peek(raw, "format_version")
        if fmt[0] not in (None, FORMAT) or fmt[1] not in (None, FORMAT_VERSION):
            raise ForeignCheckpoint(
                path, f"format {fmt[0]!r} version {fmt[1]!r} is not one this client reads"
            ) from None
        raise CheckpointCorrupt(path, f"manifest does not parse: {exc.errors()[:2]}") from None
    if head is None:
        raise CheckpointCorrupt(path, "manifest is not a JSON object")
    if head.format != FORMAT or head.format_version != FORMAT_VERSION:
        raise ForeignCheckpoint(
            path,
            f"format {head.format!r} version {head.format_version} is not {FORMAT!r} version {FORMAT_VERSION}",
        )
    if job_id is not None and head.job_id != job_id:
        raise ForeignCheckpoint(path, f"checkpoint of job {head.job_id!r}, not of {job_id!r}")
    _check_consistent(path, head)
    return head


def _peek(raw: bytes, field: str) -> Any:
    import json

    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc.get(field) if isinstance(doc, dict) else None


def _check_consistent(path: str, m: Manifest) -> None:
    if sum(c.bytes for c in m.chunks) != m.total_bytes:
        raise CheckpointCorrupt(
            path, f"chunks add up to {sum(c.bytes for c in m.chunks)} bytes, not {m.total_bytes}"
        )
    for c in m.chunks[:-1]:
        if c.bytes != m.chunk_bytes:
            raise CheckpointCorrupt(path, f"{c.file} holds {c.bytes} bytes, chunks hold {m.chunk_bytes}")
    for t in m.tensors:
        if t.offset + t.nbytes > m.total_bytes or sum(p.length for p in t.pieces) != t.nbytes:
            raise CheckpointCorrupt(path, f"tensor {t.name} lies outside the data")
        if t.shape and any(d < 0 for d in t.shape):
            raise CheckpointCorrupt(path, f"tensor {t.name} has a negative dimension")


def latest_complete(store: Store, job_id: str) -> tuple[str, Manifest] | None:
    """The newest checkpoint of the job with a valid manifest; torn ones (no or unreadable manifest) are
    skipped, and so are checkpoints of another job (only a directory shared under the naming of older
    versions, where `exp/1` and `exp:1` were both `exp_1`, holds them).

    A manifest in an unknown format is refused, not skipped: it may be this job's, written by a newer
    client, and resuming from an older checkpoint would silently lose work."""
    for listed in reversed(list_checkpoints(store, job_id)):
        if not listed.complete:
            log.warning("checkpoint %s is torn (no manifest): skipped", store.uri(listed.path))
            continue
        try:
            manifest = read_manifest(store, listed.path, None)
        except ForeignCheckpoint:
            raise
        except CheckpointCorrupt as exc:
            log.warning(
                "checkpoint %s has no valid manifest: skipped (%s)", store.uri(listed.path), exc.reason
            )
            continue
        if manifest.job_id != job_id:
            log.warning(
                "checkpoint %s is of job %r, not of %r: skipped",
                store.uri(listed.path),
                manifest.job_id,
                job_id,
            )
            continue
        return listed.path, manifest
    return None


def read_arena(store: Store, directory: str, manifest: Manifest, arena: Bytes) -> None:
    """Every chunk into its place in `arena`, each verified against its size and CRC-32C."""
    offset = 0
    for chunk in manifest.chunks:
        path = store.join(directory, chunk.file)
        dst = memoryview(arena[offset : offset + chunk.bytes])  # type: ignore[arg-type]
        try:
            got, more = store.read_into(path, dst)
        except (FileNotFoundError, NotADirectoryError):
            raise CheckpointCorrupt(path, "chunk file is missing") from None
        if got != chunk.bytes or more:
            raise CheckpointCorrupt(
                path, f"chunk holds {'more than ' if more else ''}{got} bytes, not {chunk.bytes}"
            )
        crc = f"{crc32c.crc32c(dst):08x}"
        if crc != chunk.crc32c:
            raise CheckpointCorrupt(path, f"checksum mismatch: crc32c {crc}, manifest says {chunk.crc32c}")
        offset += chunk.bytes


def read_checkpoint(store: Store, directory: str, manifest: Manifest) -> Bytes:
    arena = np.empty(max(manifest.total_bytes, 1), dtype=np.uint8)[: manifest.total_bytes]
    read_arena(store, directory, manifest, arena)
    return arena


def prune(store: Store, job_id: str, keep: int, newest: str) -> list[str]:
    """Delete all but the `keep` newest complete checkpoints, once `newest` is published.

    Torn directories older than the newest are leftovers of dead flushes and go too. A checkpoint whose
    manifest names another job is neither counted nor deleted. A checkpoint is deleted manifest first,
    so a deletion cut short leaves a torn directory, never a corrupt one."""
    listed = [c for c in list_checkpoints(store, job_id) if not _of_other_job(store, c, job_id)]
    complete = [c for c in listed if c.complete]
    if not any(c.path == newest for c in complete):
        return []
    newest_step = next(c.step for c in complete if c.path == newest)
    kept = {c.path for c in complete[-keep:]} if keep > 0 else set()
    kept.add(newest)
    deleted = []
    for c in listed:
        if c.path in kept or (not c.complete and c.step >= newest_step):
            continue
        if c.complete:
            store.remove(store.join(c.path, MANIFEST))
        store.rmtree(c.path)
        deleted.append(c.path)
    return deleted


def _of_other_job(store: Store, listed: Listed, job_id: str) -> bool:
    """Whether the checkpoint's manifest names another job (one that does not parse names none)."""
    if not listed.complete:
        return False
    raw = store.read_bytes(store.join(listed.path, MANIFEST))
    other = _peek(raw, "job_id") if raw is not None else None
    return isinstance(other, str) and other != job_id


def cleanup_torn(store: Store, directory: str) -> None:
    """After a failed flush: remove what it left, temporary files included (best effort)."""
    try:
        if not store.exists(store.join(directory, MANIFEST)):
            store.rmtree(directory)
    except Exception:  # the storage may be what failed
        log.debug("could not clean up %s", directory, exc_info=True)


__all__ = [
    "TMP_SUFFIX",
    "Listed",
    "TensorRecord",
    "Written",
    "cleanup_torn",
    "job_dir",
    "job_dir_name",
    "latest_complete",
    "list_checkpoints",
    "prune",
    "read_arena",
    "read_checkpoint",
    "read_manifest",
    "write_checkpoint",
]
