"""Wiring of the domain pieces into one gang scheduler (for bootstrap, tests and benchmarks)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tessera.scheduler.domain.cache import SchedulerCache
from tessera.scheduler.domain.framework.runtime import Framework
from tessera.scheduler.domain.gang.queue import BackoffPolicy, GangQueue, QueueOrder
from tessera.scheduler.domain.gang.registry import GangRegistry
from tessera.scheduler.domain.gang.scheduler import GangScheduler
from tessera.scheduler.domain.gang.spec import GangSpec
from tessera.scheduler.domain.plugins.fragmentation import FragmentationScore
from tessera.scheduler.domain.plugins.profiles import build_profile
from tessera.scheduler.domain.plugins.reserve import BindingPort
from tessera.scheduler.domain.snapshot import Allocation, NodeInfo


@dataclass(frozen=True)
class Assembly:
    cache: SchedulerCache
    registry: GangRegistry
    queue: GangQueue
    framework: Framework
    scheduler: GangScheduler


def assemble(
    nodes: Iterable[NodeInfo],
    port: BindingPort,
    config: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    gangs: bool = True,
    backoff: BackoffPolicy | None = None,
    max_parked_s: float = 300.0,
    order: QueueOrder = QueueOrder.SUBMITTED,
    bound: Iterable[Allocation] = (),
    gangs_known: Iterable[GangSpec] = (),
    fragmentation: FragmentationScore | None = None,
    pipeline: bool = True,
) -> Assembly:
    """A scheduler over ``nodes``, binding through ``port``.

    After a restart, ``bound`` (the placements persisted or listed from the API) and ``gangs_known``
    (the gangs still live) rebuild the cache and the gang registry; nothing else is needed.
    ``pipeline``: through a port that can start binds and return, the next gangs are decided while
    the binds of those before are in flight (else decided gangs are bound together, then waited for).
    """
    bound = tuple(bound)
    cache = SchedulerCache.rebuild(nodes, bound)
    registry = GangRegistry.rebuild(gangs_known, bound)
    queue = GangQueue(backoff, max_parked_s, order)
    framework = Framework(
        build_profile(cache, registry, port, config, gangs=gangs, fragmentation=fragmentation)
    )
    scheduler = GangScheduler(framework, cache, registry, queue, port, pipeline=pipeline)
    return Assembly(cache, registry, queue, framework, scheduler)
