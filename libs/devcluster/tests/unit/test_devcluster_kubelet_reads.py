"""The simulated kubelet reads the stored pods from its watch uncopied, and changes none of them."""

from __future__ import annotations

import asyncio
from typing import Any

from tessera.devcluster.apiserver.resources import PODS
from tessera.devcluster.apiserver.store import ObjectStore
from tessera.devcluster.apiserver.watching import Watch
from tessera.devcluster.sim.kubelet import Kubelet


class _Ctx:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store


async def test_the_kubelet_watch_asks_for_the_stored_objects(monkeypatch: Any) -> None:
    store = ObjectStore()
    asked: list[bool] = []
    seen: list[dict[str, Any]] = []
    next_event = Watch.next

    async def recording(self: Watch, wait_seconds: float | None = None, *, copy_object: bool = True) -> Any:
        asked.append(copy_object)
        return await next_event(self, wait_seconds, copy_object=copy_object)

    monkeypatch.setattr(Watch, "next", recording)
    kubelet = Kubelet.__new__(Kubelet)
    kubelet.ctx = _Ctx(store)  # type: ignore[assignment]
    monkeypatch.setattr(kubelet, "on_event", lambda kind, pod: seen.append(pod), raising=False)

    task = asyncio.create_task(kubelet.run())
    await asyncio.sleep(0)
    created = store.create(PODS, "ns", {"metadata": {"name": "a"}, "spec": {"containers": [{"name": "c"}]}})
    for _ in range(50):
        if seen:
            break
        await asyncio.sleep(0.01)
    task.cancel()

    assert asked and not any(asked)
    assert seen[0] == created and any(obj is seen[0] for _, obj in store.contents()[1])
