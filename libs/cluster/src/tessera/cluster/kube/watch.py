"""A watch stream served by a dedicated thread, so the blocking client never stalls the event loop.

The thread reads newline-delimited JSON events from the raw response and hands them to the loop
through a queue, waking the loop once per burst of events rather than once per event. Closing the async iterator shuts the socket down, which wakes the thread at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from tessera.cluster.kube.errors import status_message, translate
from tessera.cluster.port import ClusterError, EventType, Unparseable, WatchEvent, WatchExpired

_END = object()
log = logging.getLogger(__name__)

_LOG_EVERY_S = 300.0  # an object that stays unparseable is logged once per this, not on every change
_LOGGED_MAX = 4096
_logged: dict[tuple[str, str], float] = {}


async def stream_events(
    open_stream: Callable[[], Any],
    parse: Callable[[dict[str, Any]], Any],
    name: str,
) -> AsyncIterator[WatchEvent[Any]]:
    """Yield parsed watch events from ``open_stream()`` (a raw urllib3 response) until it ends.

    Raises WatchExpired on a 410 (as an HTTP status or an ERROR event), ClusterError otherwise.
    BOOKMARK events only move the resourceVersion on. An object that fails to parse comes as a
    DELETED event carrying `Unparseable` (its key and why), as a list would leave it out.
    """
    loop = asyncio.get_running_loop()
    pending: collections.deque[Any] = collections.deque()
    ready = asyncio.Event()  # set on the loop once items wait in `pending`
    woken = threading.Event()  # a wake-up is on its way to the loop: no need for another
    holder: dict[str, Any] = {}
    stop = threading.Event()

    def put(item: Any) -> None:
        # One wake-up per burst, not per event: waking the loop from another thread writes to its
        # self-pipe, a system call each time, and a busy watch delivers hundreds of events a second.
        pending.append(item)
        if not woken.is_set():
            woken.set()
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody listens any more
                loop.call_soon_threadsafe(ready.set)

    async def get() -> Any:
        while not pending:
            woken.clear()  # before looking again, so an item put from now on wakes the loop
            if pending:
                break
            await ready.wait()
            ready.clear()
        return pending.popleft()

    def pump() -> None:
        try:
            response = open_stream()
            holder["response"] = response
            if stop.is_set():
                return
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if stop.is_set():
                    return
                if line.strip():
                    put(json.loads(line))
        except ApiException as exc:
            put(translate(exc))
        except Exception as exc:  # a dropped connection ends the stream; the reflector resumes
            if not stop.is_set():
                put(exc)
        finally:
            response = holder.get("response")
            if response is not None:
                with contextlib.suppress(Exception):
                    response.release_conn()
            put(_END)

    thread = threading.Thread(target=pump, name=f"watch-{name}", daemon=True)
    thread.start()
    try:
        while True:
            item = await get()
            if item is _END:
                return
            if isinstance(item, ClusterError):
                raise item
            if isinstance(item, Exception):
                raise ClusterError(f"watch {name}: {item}") from item
            event = _event(item, parse, name)
            if event is not None:
                yield event
    finally:
        stop.set()
        response = holder.get("response")
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()


def _event(raw: dict[str, Any], parse: Callable[[dict[str, Any]], Any], name: str) -> WatchEvent[Any] | None:
    kind = raw.get("type")
    obj = raw.get("object") or {}
    if kind == "ERROR":
        code = obj.get("code")
        if code == 410:
            raise WatchExpired(status_message(json.dumps(obj)))
        raise ClusterError(f"watch {name}: {status_message(json.dumps(obj))}")
    if kind == "BOOKMARK" or kind not in ("ADDED", "MODIFIED", "DELETED"):
        return None
    metadata: dict[str, Any] = obj.get("metadata") or {}
    if not isinstance(metadata, dict):
        metadata = {}
    version = str(metadata.get("resourceVersion", ""))
    try:
        parsed = parse(obj)
    except Exception as exc:  # a malformed object of any kind, not only a ValueError from the parser
        key = _key(metadata)
        if key is None:  # nameless: no store can hold it
            log.warning("skipping a watched object without a name", extra={"watch": name, "error": str(exc)})
            return None
        if kind != "DELETED":
            _log_unparseable(name, key, exc)
        # Whatever the event, the object is gone as far as Tessera can tell, as it is from a list.
        return WatchEvent(EventType.DELETED, Unparseable(key, str(exc)), version)
    return WatchEvent(EventType(kind), parsed, version)


def _key(metadata: dict[str, Any]) -> str | None:
    namespace, name = metadata.get("namespace"), metadata.get("name")
    if not name:
        return None
    return f"{namespace}/{name}" if namespace else str(name)


def _log_unparseable(watch: str, key: str, exc: Exception) -> None:
    now = time.monotonic()
    if now - _logged.get((watch, key), -_LOG_EVERY_S) < _LOG_EVERY_S:
        log.debug(
            "a watched object still does not parse", extra={"watch": watch, "key": key, "error": str(exc)}
        )
        return
    if len(_logged) >= _LOGGED_MAX:
        _logged.clear()
    _logged[(watch, key)] = now
    log.warning(
        "a watched object does not parse: treated as deleted",
        extra={"watch": watch, "key": key, "error": str(exc)},
    )
