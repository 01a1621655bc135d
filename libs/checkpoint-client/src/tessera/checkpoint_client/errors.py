"""Why a restore was refused. Each message names the file or the tensor at fault."""

from __future__ import annotations


class CheckpointError(Exception):
    """Base of every refusal."""


class CheckpointNotFound(CheckpointError):
    """No complete checkpoint where one was asked for."""


class CheckpointCorrupt(CheckpointError):
    """A manifest that does not parse, a chunk that is missing, short or fails its checksum."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class ForeignCheckpoint(CheckpointError):
    """A checkpoint of another job, or in a format version this client does not read."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class StateMismatch(CheckpointError):
    """The state to restore into does not match the checkpoint (shape, dtype or names)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason
