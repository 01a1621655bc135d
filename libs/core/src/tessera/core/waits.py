"""Sleeping in background loops: until stop, until woken, or until a timeout, whichever comes first."""

from __future__ import annotations

import asyncio
import contextlib


async def wait_any(*events: asyncio.Event, timeout: float | None) -> bool:
    """Return once any of `events` is set or `timeout` seconds pass; True when an event was set.

    Loops call it as `await wait_any(stop, wake, timeout=interval)`; it leaves no task behind."""
    if any(event.is_set() for event in events):
        return True
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        return bool(done)
    finally:
        for waiter in waiters:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
