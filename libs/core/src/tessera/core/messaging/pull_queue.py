"""The consumer's one reach into nats.py's pull subscription, kept here and nowhere else.

Written against nats-py 2.16 (`nats/aio/subscription.py`, `nats/js/client.py`). A pull
subscription's `fetch` takes the messages of a batch one `next_msg` at a time, and `next_msg` makes a
task of its own (named with a fresh UUID) around `asyncio.wait_for(queue.get(), timeout)`, which on
Python 3.11 makes a second task: two tasks and a turn of the event loop per message, even for a
message that is already in the subscription's queue. :func:`take_queued_at_once` makes `next_msg`
hand over a message already queued at once, as nats.py's own `next_msg` would after that turn:
taken off the queue, its bytes no longer counted pending, marked done. A `next_msg` that must wait
(the queue is empty, or its timeout has run out) is nats.py's own, unchanged, so `fetch` keeps
every rule of its own: which pulls it sends, the status messages, its deadline."""

from __future__ import annotations

import asyncio
from typing import Any

from nats.aio.msg import Msg


def take_queued_at_once(sub: Any) -> bool:
    """Make the `next_msg` of `sub` (a pull subscription's nats.py subscription) take an already
    queued message without a task; False (and `sub` untouched) when it is not the nats.py
    subscription this was written against."""
    queue = getattr(sub, "_pending_queue", None)
    waiting = getattr(sub, "next_msg", None)
    if not isinstance(queue, asyncio.Queue) or not isinstance(getattr(sub, "_pending_size", None), int):
        return False
    if waiting is None or getattr(sub, "_cb", None) is not None or getattr(sub, "_conn", None) is None:
        return False
    if getattr(waiting, "_tessera_takes_queued", False):
        return True

    async def next_msg(timeout: float | None = 1.0) -> Msg:
        if queue.empty() or (timeout is not None and timeout <= 0) or sub._conn.is_closed:
            waited: Msg = await waiting(timeout)  # nats.py's: waits, times out or raises as it does
            return waited
        msg: Msg = queue.get_nowait()
        sub._pending_size -= len(msg.data)
        queue.task_done()
        return msg

    next_msg._tessera_takes_queued = True  # type: ignore[attr-defined]
    sub.next_msg = next_msg
    return True
