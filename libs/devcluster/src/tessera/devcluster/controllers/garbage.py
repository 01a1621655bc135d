"""The garbage collector: when an owner is deleted, its dependents go after it (background deletion).

`Orphan` and `Foreground` deletions are done by the API server when it answers the DELETE
(`tessera.devcluster.apiserver.ownership`); what is left with an owner reference to a deleted owner
is deleted here, depth first.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from tessera.devcluster.apiserver.ownership import OWNER_TYPES, delete_dependents
from tessera.devcluster.apiserver.resources import ResourceType
from tessera.devcluster.apiserver.store import ObjectStore


class GarbageCollector:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._watch(rtype)) for rtype in OWNER_TYPES]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _watch(self, rtype: ResourceType) -> None:
        watch = self.store.watch(rtype, resource_version=str(self.store.revision))
        try:
            async for event in watch:
                if event["type"] == "DELETED":
                    self.collect(event["object"])
        finally:
            watch.close()

    def collect(self, owner: dict[str, Any]) -> None:
        delete_dependents(self.store, owner["metadata"]["uid"])
