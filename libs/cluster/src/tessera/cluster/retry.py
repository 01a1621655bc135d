"""Optimistic-concurrency retries shared by every `Cluster` implementation."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping

from tessera.cluster.port import ConfigMap, ConfigMapMutation, Conflict

DEFAULT_ATTEMPTS = 5


async def update_config_map_with_retry(
    read: Callable[[], Awaitable[ConfigMap | None]],
    write: Callable[[Mapping[str, str], str | None], Awaitable[ConfigMap]],
    mutate: ConfigMapMutation,
    attempts: int = DEFAULT_ATTEMPTS,
) -> ConfigMap:
    """Read, mutate, write with the resourceVersion read (None: create); reread on Conflict.

    ``write(data, resource_version)`` must create when the version is None (Conflict if the object
    appeared meanwhile) and replace only that version otherwise (Conflict when it is stale).
    """
    last: Conflict | None = None
    for _ in range(attempts):
        current = await read()
        base: Mapping[str, str] = dict(current.data) if current is not None else {}
        result = mutate(base)
        data = await result if inspect.isawaitable(result) else result
        try:
            return await write(dict(data), current.resource_version if current is not None else None)
        except Conflict as exc:
            last = exc
    raise Conflict(f"configmap update gave up after {attempts} conflicting attempts: {last}")
