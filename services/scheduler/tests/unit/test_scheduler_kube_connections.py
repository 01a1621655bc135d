"""The scheduler keeps enough connections to the API server open for everything that uses them."""

from __future__ import annotations

import inspect

from tessera.cluster.kube import KubernetesCluster
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.service_layer.tracing import BIND_PARALLELISM

WATCHES = 3  # nodes, pods, podgroups
LEASE = 1


def test_the_default_connections_cover_the_watches_the_lease_and_both_thread_pools() -> None:
    """The binding threads bind on the same ApiClient as the adapter's pool: with fewer connections
    than callers, every call beyond them opens a connection of its own and throws it away."""
    api_threads = inspect.signature(KubernetesCluster).parameters["max_workers"].default
    default = SchedulerSettings.model_fields["kube_connections"].default
    assert default >= WATCHES + LEASE + api_threads + BIND_PARALLELISM
