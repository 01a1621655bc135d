"""What the scheduler's handlers and loop share, built once in `bootstrap.py`."""

from __future__ import annotations

from dataclasses import dataclass

from tessera.cluster.kube import KubernetesCluster
from tessera.cluster.leader import LeaderElector
from tessera.core.runner import ServiceContext
from tessera.scheduler.adapters.cluster_side import ClusterSide
from tessera.scheduler.service_layer.engine import SchedulingEngine


@dataclass
class ClusterConnection:
    """The cluster the scheduler watches and binds on (none in inventory mode)."""

    cluster: KubernetesCluster
    side: ClusterSide
    leader: LeaderElector | None = None
    """Only the holder of the lease decides (none: leader election is off)."""


@dataclass
class SchedulerDeps:
    ctx: ServiceContext
    engine: SchedulingEngine
    cluster: ClusterConnection | None = None
