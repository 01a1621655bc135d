"""Watch events and live subscriptions to the object store."""

from __future__ import annotations

import asyncio
import copy
import threading
from dataclasses import dataclass
from typing import Any

from tessera.devcluster.apiserver.resources import ResourceType
from tessera.devcluster.apiserver.selectors import Selector


@dataclass(frozen=True)
class StoredEvent:
    """One change in the store: the object after it (or its last state when deleted) and before it."""

    resource_version: int
    type: str  # ADDED, MODIFIED or DELETED
    resource: ResourceType
    namespace: str
    obj: dict[str, Any]
    old: dict[str, Any] | None

    def seen_through(self, namespace: str | None, selector: Selector) -> dict[str, Any] | None:
        """The event as a watcher with this scope sees it, or None when it is out of scope.

        An object that stops matching a selector is DELETED for that watcher, and one that starts
        matching is ADDED, as the Kubernetes watch cache does it.
        """
        if namespace is not None and self.namespace != namespace:
            return None
        now = selector.matches(self.obj) and self.type != "DELETED"
        before = selector.matches(self.old) if self.type != "ADDED" else False
        if self.type == "DELETED":
            before = selector.matches(self.obj)
        if now and before:
            kind = "MODIFIED"
        elif now:
            kind = "ADDED"
        elif before:
            kind = "DELETED"
        else:
            return None
        return {"type": kind, "object": self.obj}


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class Watch:
    """A live subscription; iterate it for `{"type", "object"}` events. Thread-safe to feed."""

    def __init__(
        self,
        resource: ResourceType,
        namespace: str | None,
        selector: Selector,
        loop: asyncio.AbstractEventLoop,
        backlog: list[dict[str, Any]],
        on_close: Any,
    ) -> None:
        self.resource = resource
        self.namespace = namespace
        self.selector = selector
        self._loop = loop
        self._queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        for item in backlog:
            self._queue.put_nowait(item)
        self._on_close = on_close
        self._closed = threading.Event()

    def offer(self, event: StoredEvent) -> None:
        """Called by the store (any thread) for every change of this resource."""
        if self._closed.is_set() or event.resource != self.resource:
            return
        seen = event.seen_through(self.namespace, self.selector)
        if seen is not None:
            self._put(seen)

    def _put(self, item: dict[str, Any] | None) -> None:
        try:
            if _running_loop() is self._loop:
                # On the loop's own thread (a request handler or an in-process controller wrote):
                # the same queue of callbacks, in the same order, without waking the loop through
                # its self-pipe, a system call per event per watcher.
                self._loop.call_soon(self._queue.put_nowait, item)
            else:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._closed.set()

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._on_close(self)
            self._put(None)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def next(
        self, wait_seconds: float | None = None, *, copy_object: bool = True
    ) -> dict[str, Any] | None:
        """The next event, or None when closed or when `wait_seconds` pass.

        The object is deep-copied unless `copy_object` is false (for callers that only serialise it).
        """
        if self._closed.is_set() and self._queue.empty():
            return None
        if not self._queue.empty():
            item = self._queue.get_nowait()  # no timer and no task for an event already queued
        else:
            try:
                item = await asyncio.wait_for(self._queue.get(), wait_seconds)
            except TimeoutError:
                return None
        if item is None:
            return None
        obj = copy.deepcopy(item["object"]) if copy_object else item["object"]
        return {"type": item["type"], "object": obj}

    def ready(self, limit: int, *, copy_object: bool = True) -> list[dict[str, Any]]:
        """The events already queued, at most ``limit``, without waiting; none once closed."""
        out: list[dict[str, Any]] = []
        while len(out) < limit and not self._queue.empty():
            item = self._queue.get_nowait()
            if item is None:  # closed: `next` answers None from now on
                break
            obj = copy.deepcopy(item["object"]) if copy_object else item["object"]
            out.append({"type": item["type"], "object": obj})
        return out

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> dict[str, Any]:
        item = await self.next()
        if item is None:
            raise StopAsyncIteration
        return item
