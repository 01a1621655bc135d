"""Where checkpoints go: any fsspec URL. Local files get POSIX durability, other filesystems their own.

Local files (`file://`, or a plain path): each chunk is written to `<name>.tmp`, fsynced, dropped from the
page cache (the trainer never reads it back) and renamed into place; the directory is fsynced after the
renames. The fsyncs run on a helper thread one chunk behind the writes, so the disk is busy from the first
chunk on instead of waiting for the kernel's writeback. The manifest is written the same way, last.

Other filesystems (s3://, gs://, memory:// ...): a file exists once it is closed (an object store PUT or
multipart upload completes on close), data and manifest are written to temporary names and moved into
place (`rename_data=False` writes data chunks under their final names, saving an object-store copy; the
manifest is still moved last, so a reader never sees it before the data).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import crc32c
import fsspec
from fsspec.implementations.local import LocalFileSystem

from tessera.checkpoint_client.format import TMP_SUFFIX

SLICE = 4 << 20  # checksum and write in 4 MiB slices, so the checksum reads what the write reads next
SYNC_WINDOW = 2  # chunks written but not yet fsynced


class Store(Protocol):
    root: str

    def join(self, *parts: str) -> str: ...

    def uri(self, path: str) -> str: ...

    def makedirs(self, path: str) -> None: ...

    def write_chunks(self, directory: str, chunks: Sequence[tuple[str, memoryview]]) -> list[int]:
        """Write every chunk durably under its name; returns their CRC-32C."""
        ...

    def publish(self, directory: str, name: str, data: bytes) -> None:
        """After `write_chunks` into `directory`: make their renames durable, then write `name` atomically;
        once this returns, the directory and all it holds survive a crash."""
        ...

    def listdir(self, path: str) -> list[str]: ...

    def exists(self, path: str) -> bool: ...

    def read_bytes(self, path: str) -> bytes | None: ...

    def read_into(self, path: str, dst: memoryview) -> tuple[int, bool]:
        """Fill `dst` from the file; (bytes read, whether the file holds more)."""
        ...

    def remove(self, path: str) -> None: ...

    def rmtree(self, path: str) -> None: ...


def open_store(url: str, storage_options: dict[str, Any] | None = None, *, rename_data: bool = True) -> Store:
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    if isinstance(fs, LocalFileSystem):
        return LocalStore(path)
    return FsspecStore(fs, path, rename_data=rename_data)


def write_crc(write: Any, data: memoryview) -> int:
    """Write `data` with `write` (which may write less than asked) in slices, checksumming each first."""
    crc = 0
    view = data.cast("B") if data.format != "B" or data.ndim != 1 else data
    for start in range(0, len(view), SLICE):
        piece = view[start : start + SLICE]
        crc = crc32c.crc32c(piece, crc)
        done = 0
        while done < len(piece):
            written = write(piece[done:])
            done += len(piece) if written is None else written
    return crc


class LocalStore:
    """POSIX files: tmp name, fsync, rename, fsync of the directory."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._unsynced: set[str] = set()  # directories whose new entries are not durable yet

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def uri(self, path: str) -> str:
        return "file://" + os.path.abspath(path)

    def makedirs(self, path: str) -> None:
        missing = []
        head = os.path.abspath(path)
        while not os.path.isdir(head):
            missing.append(head)
            head = os.path.dirname(head)
        os.makedirs(path, exist_ok=True)
        self._unsynced.update(os.path.dirname(created) for created in missing)  # fsynced by `publish`

    def write_chunks(self, directory: str, chunks: Sequence[tuple[str, memoryview]]) -> list[int]:
        crcs = []
        in_flight: deque[Future[None]] = deque()
        with ThreadPoolExecutor(1, thread_name_prefix="tessera-ckpt-fsync") as syncer:
            try:
                for name, data in chunks:
                    final = os.path.join(directory, name)
                    tmp = final + TMP_SUFFIX
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
                    try:
                        crcs.append(write_crc(lambda b, fd=fd: os.write(fd, b), data))
                    except BaseException:
                        os.close(fd)
                        raise
                    in_flight.append(syncer.submit(_sync_and_rename, fd, tmp, final))
                    while len(in_flight) > SYNC_WINDOW:
                        in_flight.popleft().result()
                while in_flight:
                    in_flight.popleft().result()
            finally:
                for pending in in_flight:  # after a failure: every fd still gets closed
                    with contextlib.suppress(Exception):
                        pending.result()
        self._unsynced.add(directory)  # the renames: made durable by `publish` before the manifest's
        return crcs

    def publish(self, directory: str, name: str, data: bytes) -> None:
        """The manifest is written and fsynced while the data renames are being made durable (the two are
        independent); only its rename waits for both. Then the directory and any new parent are fsynced."""
        path = os.path.join(directory, name)
        tmp = path + TMP_SUFFIX
        with ThreadPoolExecutor(1, thread_name_prefix="tessera-ckpt-fsync") as syncer:
            renames = syncer.submit(fsync_dir, directory)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                write_crc(lambda b: os.write(fd, b), memoryview(data))
                os.fsync(fd)
            finally:
                os.close(fd)
            renames.result()
            os.rename(tmp, path)
            parents = sorted(p for p in self._unsynced - {directory} if os.path.isdir(p))  # not a torn one
            synced = [syncer.submit(fsync_dir, p) for p in parents]
            fsync_dir(directory)
            for done in synced:
                done.result()
        self._unsynced.clear()

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def read_bytes(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def read_into(self, path: str, dst: memoryview) -> tuple[int, bool]:
        with open(path, "rb", buffering=0) as f:
            fd = f.fileno()
            with contextlib.suppress(OSError, AttributeError):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            view = dst.cast("B") if dst.format != "B" or dst.ndim != 1 else dst
            done = 0
            while done < len(view):
                n = f.readinto(view[done:])
                if not n:
                    break
                done += n
            more = bool(f.read(1))
            with contextlib.suppress(OSError, AttributeError):  # restored state is not read twice
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return done, more

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def rmtree(self, path: str) -> None:
        for name in self.listdir(path):
            self.remove(os.path.join(path, name))
        with contextlib.suppress(FileNotFoundError, OSError):
            os.rmdir(path)


def _sync_and_rename(fd: int, tmp: str, final: str) -> None:
    try:
        os.fsync(fd)
        with contextlib.suppress(OSError, AttributeError):  # written once, never read back here
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    os.rename(tmp, final)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FsspecStore:
    """Any other fsspec filesystem: a file is committed when closed; temporary names, then a move."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, *, rename_data: bool = True) -> None:
        self.fs = fs
        self.root = root
        self.rename_data = rename_data

    def join(self, *parts: str) -> str:
        return posixpath.join(*parts)

    def uri(self, path: str) -> str:
        return str(self.fs.unstrip_protocol(path))

    def makedirs(self, path: str) -> None:
        self.fs.makedirs(path, exist_ok=True)

    def write_chunks(self, directory: str, chunks: Sequence[tuple[str, memoryview]]) -> list[int]:
        crcs = []
        for name, data in chunks:
            final = posixpath.join(directory, name)
            target = final + TMP_SUFFIX if self.rename_data else final
            with self.fs.open(target, "wb") as f:
                crcs.append(write_crc(f.write, data))
            if self.rename_data:
                self.fs.mv(target, final)
        return crcs

    def write_atomic(self, path: str, data: bytes) -> None:
        tmp = path + TMP_SUFFIX
        with self.fs.open(tmp, "wb") as f:
            f.write(data)
        self.fs.mv(tmp, path)

    def publish(self, directory: str, name: str, data: bytes) -> None:
        self.write_atomic(posixpath.join(directory, name), data)

    def listdir(self, path: str) -> list[str]:
        try:
            entries = self.fs.ls(path, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(posixpath.basename(str(e).rstrip("/")) for e in entries)

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    def read_bytes(self, path: str) -> bytes | None:
        try:
            return bytes(self.fs.cat_file(path))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def read_into(self, path: str, dst: memoryview) -> tuple[int, bool]:
        view = dst.cast("B") if dst.format != "B" or dst.ndim != 1 else dst
        done = 0
        with self.fs.open(path, "rb") as f:
            while done < len(view):
                data = f.read(min(SLICE * 4, len(view) - done))
                if not data:
                    break
                view[done : done + len(data)] = data
                done += len(data)
            more = bool(f.read(1))
        return done, more

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(path)

    def rmtree(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(path, recursive=True)
