"""The object store's revisions, its history of events, and the watches it feeds.

One global, monotonically increasing resourceVersion orders every write, as etcd's revision does.
A bounded history of events lets watchers resume from a resourceVersion; a watcher asking for one
older than the history, or newer than the store's revision, gets 410 Gone and must relist.

A store that is persisted (see tessera.devcluster.persistence) reserves its revisions a block at a
time, recording the block's ceiling before it uses any of it. Restarted after a crash, it restores
the last snapshot and goes on past that ceiling (`resume_after`): no resourceVersion a watcher or a
writer may have seen before the crash is ever given to something else, and a watch from one of them
gets 410 Gone, since the events after the snapshot are lost.

The log is not thread-safe: the store calls it under its own lock.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from tessera.devcluster.apiserver import errors
from tessera.devcluster.apiserver.resources import ResourceType
from tessera.devcluster.apiserver.selectors import Selector
from tessera.devcluster.apiserver.watching import StoredEvent, Watch

REVISION_BLOCK = 10_000
"""How many revisions a persisted store reserves at a time (one small synchronous write each)."""


class RevisionLog:
    def __init__(self, history: int) -> None:
        if history < 1:
            raise ValueError(f"history must be at least 1, got {history}")
        self.revision = 0
        self._history: collections.deque[StoredEvent] = collections.deque(maxlen=history)
        self._compacted = 0  # the newest revision no longer in the history
        self._watches: set[Watch] = set()
        self._reserve: Callable[[int], None] | None = None
        self._reserved = 0  # the newest revision reserved; the next write past it reserves a block
        self._block = REVISION_BLOCK

    # ---- revisions ---------------------------------------------------------------------------

    def next_revision(self) -> int:
        """Take the next revision, reserving a block first when it is past those reserved."""
        revision = self.revision + 1
        if self._reserve is not None and revision > self._reserved:
            self._reserve(revision + self._block - 1)
            self._reserved = revision + self._block - 1
        self.revision = revision
        return revision

    def restart_at(self, revision: int) -> None:
        """Start over at ``revision`` with an empty history (a restored snapshot)."""
        self._history.clear()
        self.revision = self._compacted = self._reserved = revision

    def resume_after(self, reserved: int) -> None:
        """Go on past ``reserved`` (see `ObjectStore.resume_after`)."""
        if reserved >= self.revision:
            self.revision = self._compacted = self._reserved = reserved + 1
            self._history.clear()

    def reserve_revisions(self, reserve: Callable[[int], None], block: int) -> None:
        if block < 1:
            raise ValueError(f"block must be at least 1, got {block}")
        self._reserve, self._block, self._reserved = reserve, block, self.revision

    # ---- events and watches ------------------------------------------------------------------

    def publish(self, event: StoredEvent) -> None:
        """Keep the event in the history and offer it to every watch."""
        if len(self._history) == self._history.maxlen:
            self._compacted = self._history[0].resource_version
        self._history.append(event)
        for watch in list(self._watches):
            watch.offer(event)

    def replay(
        self, resource: ResourceType, namespace: str | None, selector: Selector, resource_version: str
    ) -> list[dict[str, Any]]:
        """The events after ``resource_version`` as a watcher with this scope sees them; 410 Gone
        when the history no longer holds them all, or when the revision is newer than the store's."""
        since = parse_revision(resource_version)
        if since < self._compacted:
            raise errors.gone(f"too old resource version: {since} ({self._compacted + 1})")
        if since > self.revision:  # seen before a crash, or given by another server
            raise errors.gone(f"Too large resource version: {since}, current: {self.revision}")
        backlog: list[dict[str, Any]] = []
        for event in self._history:
            if event.resource_version > since and event.resource == resource:
                seen = event.seen_through(namespace, selector)
                if seen is not None:
                    backlog.append(seen)
        return backlog

    @property
    def watched(self) -> bool:
        return bool(self._watches)

    def watches(self) -> list[Watch]:
        return list(self._watches)

    def add_watch(self, watch: Watch) -> None:
        self._watches.add(watch)

    def forget(self, watch: Watch) -> None:
        self._watches.discard(watch)


def parse_revision(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise errors.bad_request(f"resourceVersion {text!r} is not a valid revision") from None
    if value < 0:
        raise errors.bad_request(f"resourceVersion {text!r} must not be negative")
    return value
