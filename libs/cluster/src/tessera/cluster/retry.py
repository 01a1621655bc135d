"""Optimistic-concurrency retries shared by every `Cluster` implementation."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping

from tessera.cluster.port import ConfigMap, ConfigMapMutation, Conflict

DEFAULT_ATTEMPTS = 5


async def update_config_map_with_retry(
    read: Callable[[], Awaitable[ConfigMap | None]],
    write: Callable[[Mapping[str, str], ConfigMap | None], Awaitable[ConfigMap]],
    mutate: ConfigMapMutation,
    attempts: int = DEFAULT_ATTEMPTS,
) -> ConfigMap:
    """Read, mutate, write against what was read; reread and retry on Conflict.

    ``write(data, current)`` must create when ``current`` is None (Conflict if the object appeared
    meanwhile) and otherwise replace only ``current.resource_version`` (Conflict when it is stale).
    """
    last: Conflict | None = None
    for _ in range(attempts):
        current = await read()
        base: Mapping[str, str] = dict(current.data) if current is not None else {}
        result = mutate(base)
        data = await result if inspect.isawaitable(result) else result
        try:
            return await write(dict(data), current)
        except Conflict as exc:
            last = exc
    raise Conflict(f"configmap update gave up after {attempts} conflicting attempts: {last}")
