"""The cluster cache: a start that timed out and is tried again does not start a second set of watches."""

from __future__ import annotations

import pytest

from tessera.cluster.cache import ClusterCache
from tessera.cluster.domain import Pod
from tessera.cluster.fake import FakeCluster
from tessera.cluster.port import PodSelector, WatchEvent


async def test_starting_again_after_a_timeout_waits_for_the_same_watches() -> None:
    fake = FakeCluster()
    cache = ClusterCache(fake, pod_selector=PodSelector(), track_bound=False)
    seen: list[WatchEvent[Pod]] = []
    cache.pods.subscribe(seen.append)
    try:
        with pytest.raises(TimeoutError):
            await cache.start(timeout=0)
        await cache.start(timeout=5)

        fake.add_pod(Pod("default", "p"))
        await cache.pods.wait_for(lambda store: "default/p" in store, timeout=5)

        assert [event.object.name for event in seen] == ["p"]
        assert cache.snapshot().pods.keys() == {"default/p"}
    finally:
        await cache.stop()
