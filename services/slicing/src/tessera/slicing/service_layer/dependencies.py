"""What the slicing service's loops share, built once in `bootstrap.py`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tessera.cluster.leader import LeaderElector
from tessera.slicing.service_layer.operating import Operator
from tessera.slicing.service_layer.planning import Planning


@dataclass
class SlicingDeps:
    stop: asyncio.Event
    tick_s: float
    planning: Planning | None = None  # None without a cluster: demand is only recorded
    operator: Operator | None = None
    #: set when an operation was planned, so the operator looks at once
    wake: asyncio.Event | None = None
    #: only the holder of the slicing Lease plans (None: election off, this replica plans)
    leader: LeaderElector | None = None
