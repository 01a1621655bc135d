"""The durable format, version 1.

    <root>/<job>/step-<N>-<id>/data-00000.bin ... data-<K>.bin   the staging arena cut in chunks
    <root>/<job>/step-<N>-<id>/manifest.json                     written last; its presence commits

The manifest names every tensor with its shape, dtype and the pieces of chunks holding its bytes, and
every chunk with its size and CRC-32C. A directory without a valid manifest is torn (a flush that died)
and is never read. Readers refuse an unknown `format_version`. `<job>` is `durable.job_dir_name(job_id)`.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

FORMAT = "tessera-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TMP_SUFFIX = ".tmp"
DEFAULT_CHUNK_BYTES = 64 << 20
PIPELINE_CHUNKS = 8  # a state is cut in at least this many chunks...
MIN_CHUNK_BYTES = 8 << 20  # ...unless they would be smaller than this

_DIR = re.compile(r"^step-(\d+)-([0-9a-z]+)$")


def dir_name(step: int, checkpoint_id: str) -> str:
    return f"step-{step:010d}-{checkpoint_id}"


def parse_dir_name(name: str) -> tuple[int, str] | None:
    m = _DIR.match(name)
    return (int(m.group(1)), m.group(2)) if m else None


def effective_chunk_bytes(total: int, chunk_bytes: int) -> int:
    """`chunk_bytes` is the largest chunk; a small state gets smaller chunks (at least PIPELINE_CHUNKS of
    them, none under MIN_CHUNK_BYTES) so that writing one overlaps the fsync of the one before."""
    wanted = -(-total // PIPELINE_CHUNKS)
    wanted = -(-wanted // (1 << 20)) * (1 << 20)
    return min(chunk_bytes, max(MIN_CHUNK_BYTES, wanted))


def chunk_name(index: int) -> str:
    return f"data-{index:05d}.bin"


class _Model(BaseModel):
    # inf, -inf and NaN (a scheduler's best loss) as the JavaScript constants `Infinity`, `-Infinity` and
    # `NaN`, as Python's json writes them, instead of pydantic's default null; pydantic and json read
    # them back as the floats.
    model_config = ConfigDict(extra="ignore", frozen=True, ser_json_inf_nan="constants")


class Chunk(_Model):
    file: str
    bytes: int = Field(ge=0)
    crc32c: str = Field(description="CRC-32C (Castagnoli) of the file, 8 hex digits")


class Piece(_Model):
    chunk: int = Field(ge=0)
    offset: int = Field(ge=0, description="byte offset inside the chunk")
    length: int = Field(ge=0)


class TensorEntry(_Model):
    name: str
    path: list[str | int]
    shape: list[int]
    dtype: str
    kind: str = "numpy"
    nbytes: int = Field(ge=0)
    offset: int = Field(ge=0, description="byte offset in the concatenation of the chunks")
    pieces: list[Piece]


class ObjectEntry(_Model):
    name: str
    path: list[str | int]
    value: Any


class Manifest(_Model):
    format: str = FORMAT
    format_version: int
    job_id: str
    step: int
    checkpoint_id: str
    created_at: datetime
    total_bytes: int = Field(ge=0)
    chunk_bytes: int = Field(ge=1)
    chunks: list[Chunk]
    tensors: list[TensorEntry]
    objects: list[ObjectEntry] = []
    metadata: dict[str, Any] = {}


def pieces_for(offset: int, nbytes: int, chunk_bytes: int) -> list[Piece]:
    """The pieces of chunks that bytes [offset, offset + nbytes) of the arena fall into."""
    pieces = []
    end = offset + nbytes
    while offset < end:
        index, inner = divmod(offset, chunk_bytes)
        length = min(end - offset, chunk_bytes - inner)
        pieces.append(Piece(chunk=index, offset=inner, length=length))
        offset += length
    return pieces
