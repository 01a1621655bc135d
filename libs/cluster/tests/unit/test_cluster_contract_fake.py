"""The Cluster contract on the in-memory FakeCluster."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest

from tessera.cluster.contract import CHECKS, ClusterHarness
from tessera.cluster.conventions import parse_node, parse_pod, parse_pod_group
from tessera.cluster.domain import PodRef
from tessera.cluster.fake import FakeCluster
from tessera.cluster.port import Cluster


class FakeHarness:
    def __init__(self) -> None:
        self.fake = FakeCluster()
        self.cluster: Cluster = self.fake

    async def add_node(self, manifest: dict[str, Any]) -> None:
        self.fake.add_node(parse_node(manifest))

    async def add_pod(self, manifest: dict[str, Any]) -> None:
        self.fake.add_pod(parse_pod(manifest))

    async def add_pod_group(self, manifest: dict[str, Any]) -> None:
        self.fake.add_pod_group(parse_pod_group(manifest))

    async def delete_pod(self, ref: PodRef) -> None:
        self.fake.delete_pod(ref)

    async def write_config_map(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        self.fake.write_config_map(namespace, name, data)

    async def end_watches(self) -> None:
        self.fake.close_watches()

    async def expire_history(self) -> None:
        self.fake.compact()


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
async def test_fake_cluster_honours_the_contract(check: Callable[[ClusterHarness], Awaitable[None]]) -> None:
    await check(FakeHarness())
