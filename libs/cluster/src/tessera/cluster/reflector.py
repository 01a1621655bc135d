"""List-and-watch into a local store: resume from the last resourceVersion, relist when it expires.

This is client-go's Reflector, written against the `Cluster` port so the Kubernetes adapter and the
fake share it. A watch stream that ends (server timeout, dropped connection) is resumed from the
last version seen; one that answers 410 Gone is followed by a fresh list, and the store is replaced
with it, reporting DELETED for what vanished in the gap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Generic, TypeVar

from tessera.cluster.port import ClusterError, EventType, Listing, Unparseable, WatchEvent, WatchExpired

T = TypeVar("T")
Handler = Callable[[WatchEvent[T]], None]

log = logging.getLogger(__name__)

EMPTY_WATCH_DELAY_S = 0.05
EMPTY_WATCH_MAX_DELAY_S = 1.0


class Reflector(Generic[T]):
    """Keeps ``store`` (key -> object) in step with the cluster while ``run()`` is running."""

    def __init__(
        self,
        name: str,
        list_fn: Callable[[], Awaitable[Listing[T]]],
        watch_fn: Callable[[str], AsyncIterator[WatchEvent[T | Unparseable]]],
        key: Callable[[T], str],
        *,
        retry_delay: float = 0.5,
        max_retry_delay: float = 30.0,
    ) -> None:
        self.name = name
        self._list = list_fn
        self._watch = watch_fn
        self._key = key
        self._retry_delay = retry_delay
        self._max_retry_delay = max_retry_delay
        self._failures = 0  # unexpected failures in a row, for the backoff
        self._empty_watches = 0  # quick watches in a row that ended without an event
        self._handlers: list[Handler[T]] = []
        self._changed = asyncio.Condition()
        self.store: dict[str, T] = {}
        self.resource_version: str | None = None
        self.synced = asyncio.Event()
        self.lists = 0
        self.resumes = 0

    def subscribe(self, handler: Handler[T]) -> None:
        """Call ``handler`` for every change the store takes (synchronously, in order)."""
        self._handlers.append(handler)

    async def run(self) -> None:
        """Run until cancelled. Picks up from ``resource_version`` if it has one (a restart)."""
        while True:
            try:
                if self.resource_version is None:
                    await self._relist()
                started = time.monotonic()
                delivered = await self._watch_once()
                self.resumes += 1
                await self._pause_after_an_empty_watch(delivered, time.monotonic() - started)
            except WatchExpired:
                log.info("watch expired, relisting", extra={"reflector": self.name})
                self.resource_version = None
            except ClusterError as exc:
                log.warning("watch failed, retrying", extra={"reflector": self.name, "error": str(exc)})
                await asyncio.sleep(self._retry_delay)
            except (OSError, TimeoutError) as exc:
                log.warning(
                    "watch connection failed, retrying", extra={"reflector": self.name, "error": str(exc)}
                )
                await asyncio.sleep(self._retry_delay)
            except Exception:
                # Anything else (a bug, a handler that raised): never leave the store silently frozen.
                # Start over from a fresh list, after a backoff that grows while the failures go on.
                self._failures += 1
                delay = min(self._retry_delay * 2 ** min(self._failures - 1, 16), self._max_retry_delay)
                log.exception(
                    "reflector failed unexpectedly, relisting",
                    extra={"reflector": self.name, "failures": self._failures, "retry_in_s": delay},
                )
                self.resource_version = None
                await asyncio.sleep(delay)
            else:
                self._failures = 0

    async def _pause_after_an_empty_watch(self, delivered: int, lasted: float) -> None:
        """A watch that ends cleanly at once with nothing in it (a proxy that closes it, a confused
        server) is reopened after a pause that grows to EMPTY_WATCH_MAX_DELAY_S, never in a hot loop."""
        if delivered or lasted >= EMPTY_WATCH_MAX_DELAY_S:
            self._empty_watches = 0
            return
        self._empty_watches += 1
        delay = min(EMPTY_WATCH_DELAY_S * 2 ** min(self._empty_watches - 1, 16), EMPTY_WATCH_MAX_DELAY_S)
        await asyncio.sleep(delay)

    async def wait_for(self, predicate: Callable[[dict[str, T]], bool], timeout: float = 10.0) -> None:
        """Wait until ``predicate(store)`` holds; TimeoutError otherwise."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: predicate(self.store))

    async def _relist(self) -> None:
        listing = await self._list()
        self.lists += 1
        fresh = {self._key(item): item for item in listing.items}
        events: list[WatchEvent[T]] = []
        for key, old in self.store.items():
            if key not in fresh:
                events.append(WatchEvent(EventType.DELETED, old, listing.resource_version))
        for key, item in fresh.items():
            kind = EventType.MODIFIED if key in self.store else EventType.ADDED
            if kind is EventType.ADDED or self.store[key] != item:
                events.append(WatchEvent(kind, item, listing.resource_version))
        self.store = fresh
        self.resource_version = listing.resource_version
        await self._notify(events)
        self.synced.set()

    async def _watch_once(self) -> int:
        """Follow one watch stream until it ends; how many events it delivered."""
        assert self.resource_version is not None
        stream = self._watch(self.resource_version)
        delivered = 0
        try:
            async for event in stream:
                delivered += 1
                self.resource_version = event.resource_version
                item = event.object
                if isinstance(item, Unparseable):
                    # An object that no longer parses leaves the store, as a relist would leave it out.
                    old = self.store.pop(item.key, None)
                    if old is not None:
                        await self._notify([WatchEvent(EventType.DELETED, old, event.resource_version)])
                    continue
                key = self._key(item)
                kind = event.type
                if kind is EventType.DELETED:
                    self.store.pop(key, None)
                else:
                    if kind is EventType.MODIFIED and key not in self.store:
                        kind = EventType.ADDED  # new to the store (it did not parse before), as in client-go
                    self.store[key] = item
                await self._notify([WatchEvent(kind, item, event.resource_version)])
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        return delivered

    async def _notify(self, events: list[WatchEvent[T]]) -> None:
        for event in events:
            for handler in self._handlers:
                handler(event)
        async with self._changed:
            self._changed.notify_all()
