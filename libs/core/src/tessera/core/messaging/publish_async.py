"""The outbox relay's two reaches into nats.py's `JetStreamContext`, kept here and nowhere else.

Written against nats-py 2.16 (`nats/js/client.py`). `JetStreamContext.publish_async` first takes a
slot of its pending-PubAck semaphore (4000 by default) and registers the PubAck's future (whose done
callback gives the slot back), and only then calls `nc.publish`. When that raises (the reconnect
buffer is full while NATS is away, the connection closed, a header refused), the future is neither
returned nor ever completed, so the slot is never given back; once every slot has leaked, the next
`publish_async` waits on the semaphore for ever (with no `wait_stall`), even after NATS is back.
`publish_async` below cancels what the failed call registered, which runs that done callback and
gives the slot back. It finds those as the context's pending futures the caller does not hold, rather
than by copying the context's futures before every call, which would cost a batch time quadratic in
its size. The context also keeps its connection to itself: `connected` reads it there.

Its PubAck handler (`_handle_async_reply`) turns an error PubAck into an exception with
`APIError.from_error`, which raises it rather than returning it: the exception escapes the handler
(nats.py logs "encountered error") and the future is never completed, so a refused message (a full
stream's 503, say) looked like a PubAck that never came. `publish_async` below wraps the handler,
before the context subscribes it on its first `publish_async`, so the future fails with the error.

It takes its slot with `asyncio.wait_for(semaphore.acquire(), timeout=wait_stall)`, which on Python
3.11 wraps the acquire in a task of its own and waits for it even when a slot is free: every message
cost a task and a turn of the event loop, and with that turn nats.py's flusher wrote each message to
the socket alone (a `send` call per message). While a slot is free, `publish_async` below passes no
`wait_stall`: nats.py then awaits the acquire inline, which takes the slot without suspending, so a
round's messages go out together. Waiting for a slot is still bounded by `wait_stall` when none is
free.
"""

from __future__ import annotations

import asyncio
from collections.abc import Container
from typing import Any

import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import PubAck


def connected(js: JetStreamContext | Any) -> bool:
    """Whether the connection under `js` is up (not reconnecting, not closed); True when `js` does not
    tell (a stand-in without a connection)."""
    nc = getattr(js, "_nc", None)  # nats-py 2.16 keeps it there and exposes it nowhere else
    return bool(getattr(nc, "is_connected", True))


async def publish_async(
    js: JetStreamContext | Any,
    subject: str,
    payload: bytes,
    headers: dict[str, str],
    *,
    wait_stall: float,
    held: Container[asyncio.Future[PubAck]] = (),
) -> asyncio.Future[PubAck]:
    """`js.publish_async`, but a call that raises (or is cancelled) leaves no pending future and no
    semaphore slot behind; waiting for a slot is bounded by `wait_stall` (then nats.py raises
    `TooManyStalledMsgsError`).

    `held`: the futures of this context the caller holds, still pending. The caller must be the only
    one publishing with `publish_async` on `js` (the outbox relay is, on its service's context): then
    a pending future of `js` that is not in `held` after a failed call is one that call registered."""
    _complete_refusals(js)
    stall: float | None = None if _slot_free(js) else wait_stall
    try:
        future: asyncio.Future[PubAck] = await js.publish_async(
            subject, payload, headers=headers, wait_stall=stall
        )
    except BaseException:
        _cancel_unheld(js, held)
        raise
    return future


def _slot_free(js: Any) -> bool:
    """Whether nats.py's `publish_async` on `js` takes its slot without waiting: its PubAck handler
    is subscribed (the first call awaits the subscription before it takes a slot) and its
    semaphore has a slot free. Nothing runs between this check and the acquire, so the slot is
    there when the acquire comes."""
    if getattr(js, "_async_reply_prefix", None) is None:
        return False
    semaphore = getattr(js, "_publish_async_pending_semaphore", None)  # nats-py 2.16
    return isinstance(semaphore, asyncio.Semaphore) and not semaphore.locked()


def _cancel_unheld(js: Any, held: Container[asyncio.Future[PubAck]]) -> None:
    """Cancel the pending futures of `js` no one holds. Cancelling runs nats.py's done callback,
    which forgets the future and releases its slot (on the loop's next turn)."""
    futures = getattr(js, "_publish_async_futures", None)  # nats-py 2.16: token -> PubAck future
    if not isinstance(futures, dict):
        return
    for future in list(futures.values()):
        if not future.done() and future not in held:
            future.cancel()


def _complete_refusals(js: Any) -> None:
    """Make the context's PubAck handler fail a future with its error PubAck's `APIError` instead of
    leaving it pending; once, before the handler is subscribed (nats-py 2.16 subscribes the handler
    it finds on the context at its first `publish_async`)."""
    if getattr(js, "_async_reply_prefix", True) is not None or getattr(js, "_tessera_refusals", False):
        return  # subscribed already, not nats-py's context, or wrapped
    handle = js._handle_async_reply

    async def handle_refusals(msg: Msg) -> None:
        try:
            await handle(msg)
        except nats.js.errors.APIError as exc:
            token = msg.subject[len(js._nc._inbox_prefix) + 22 + 2 :]  # as nats-py 2.16 finds it
            future = js._publish_async_futures.get(token)
            if future is not None and not future.done():
                future.set_exception(exc)

    js._handle_async_reply = handle_refusals
    js._tessera_refusals = True
