"""What the scheduling engine holds between cycles. All of it is rebuilt from Postgres and the
cluster (see :mod:`.rebuild`) after a restart, a failed cycle, or another replica's decision."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from tessera.contracts.events import DemandChanged
from tessera.contracts.jobs import JobSpec
from tessera.scheduler.adapters.kube import ClusterBinder, Evictions, InventoryBinder
from tessera.scheduler.domain.gang.assembly import Assembly
from tessera.scheduler.domain.gang.scheduler import GangOutcome
from tessera.scheduler.domain.plugins.fragmentation import FragmentationScore
from tessera.scheduler.domain.snapshot import NodeInfo
from tessera.scheduler.service_layer.outcomes import GangInfo


@dataclass
class EngineState:
    assembly: Assembly
    gangs: dict[str, GangInfo]
    specs: dict[str, JobSpec]
    uuids: dict[str, dict[int, str]]
    nodes: dict[str, NodeInfo]
    port: InventoryBinder | ClusterBinder
    recovered: list[GangOutcome] = field(default_factory=list)
    native_submitted: dict[str, float] = field(default_factory=dict)
    last_demand: DemandChanged | None = None
    inventory_stamp: tuple[int, datetime | None] | None = None
    # The fragmentation score in the assembly's profile (None without GPU nodes at the rebuild),
    # and when the typical workload it expects was last learnt from the placements.
    fragmentation: FragmentationScore | None = None
    workload_learnt_at: float | None = None
    # The pods the scheduler asked to evict, not yet seen going: they rejoin no gang (the cluster
    # side's, kept across rebuilds).
    evictions: Evictions = field(default_factory=Evictions)
    # Members adopted bound whose GPUs the cache could not fit: held without them, not moved.
    held_without_gpus: set[str] = field(default_factory=set)
    # Pods of ours a rebuild found being deleted, bound by our bind but never recorded: held in
    # their gang's name until they are gone, no member of it; their end is not the gang's.
    leaving_unrecorded: set[str] = field(default_factory=set)
