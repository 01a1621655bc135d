"""Checkpoints for training code: snapshot into reused staging, flush in the background, restore verified.

The core takes NumPy arrays and buffer-protocol objects and never imports torch; torch `state_dict`s
(GPU tensors included) go through `tessera.checkpoint_client.torch`."""

from tessera.checkpoint_client.checkpointer import (
    ENV_URI,
    Checkpointer,
    CheckpointResult,
    SaveRequest,
    StorageUnavailable,
    latest_uri,
    load,
)
from tessera.checkpoint_client.errors import (
    CheckpointCorrupt,
    CheckpointError,
    CheckpointNotFound,
    ForeignCheckpoint,
    StateMismatch,
)
from tessera.checkpoint_client.format import DEFAULT_CHUNK_BYTES, FORMAT_VERSION
from tessera.checkpoint_client.tree import LeafAdapter, LeafInfo, NumpyAdapter, flatten

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "ENV_URI",
    "FORMAT_VERSION",
    "CheckpointCorrupt",
    "CheckpointError",
    "CheckpointNotFound",
    "CheckpointResult",
    "Checkpointer",
    "ForeignCheckpoint",
    "LeafAdapter",
    "LeafInfo",
    "NumpyAdapter",
    "SaveRequest",
    "StateMismatch",
    "StorageUnavailable",
    "flatten",
    "latest_uri",
    "load",
]
