"""Ready-made profiles: the default gang profile, and the same plugins without gangs (pod by pod)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from tessera.scheduler.domain.cache import SchedulerCache
from tessera.scheduler.domain.framework.interfaces import PermitPlugin, PreFilterPlugin, ReservePlugin
from tessera.scheduler.domain.framework.runtime import Profile, WeightedScore
from tessera.scheduler.domain.gang.registry import GangRegistry
from tessera.scheduler.domain.plugins.args import (
    CoschedulingArgs,
    GangLocalityArgs,
    GpuFitArgs,
    NodePolicyArgs,
    PluginArgs,
    PluginArgsError,
    parse_args,
)
from tessera.scheduler.domain.plugins.coscheduling import Coscheduling
from tessera.scheduler.domain.plugins.filters import (
    GpuFit,
    GpuModelFilter,
    MigResourceFilter,
    NodeConstraints,
    NodeResourcesFit,
)
from tessera.scheduler.domain.plugins.fragmentation import FragmentationScore
from tessera.scheduler.domain.plugins.reserve import BindingPort, CacheReserve, DefaultBinder
from tessera.scheduler.domain.plugins.scores import GangLocalityScore, GpuTopologyScore, NodePolicyScore


class ScoreWeights(PluginArgs):
    NodePolicy: int = Field(default=1, ge=1, le=100)
    GpuTopology: int = Field(default=2, ge=1, le=100)
    GangLocality: int = Field(default=1, ge=1, le=100)
    Fragmentation: int = Field(default=2, ge=1, le=100)


_ARGS: dict[str, type[PluginArgs]] = {
    "NodePolicy": NodePolicyArgs,
    "GpuFit": GpuFitArgs,
    "GangLocality": GangLocalityArgs,
    "Coscheduling": CoschedulingArgs,
    "weights": ScoreWeights,
}


def build_profile(
    cache: SchedulerCache,
    registry: GangRegistry,
    port: BindingPort,
    config: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    gangs: bool = True,
    fragmentation: FragmentationScore | None = None,
) -> Profile:
    """The scheduler's profile. ``config`` maps a plugin name to its arguments, validated here.

    ``gangs=False`` leaves Coscheduling out: each pod is placed and bound on its own, which is how
    kube-scheduler places pods without a gang plugin. ``fragmentation`` (built from the workload's
    typical pods) adds FGD's fragmentation-aware score.
    """
    raw = dict(config or {})
    unknown = sorted(set(raw) - set(_ARGS))
    if unknown:
        raise PluginArgsError(
            "profile", [(name, f"unknown plugin; known: {sorted(_ARGS)}") for name in unknown]
        )
    node_policy = NodePolicyScore(parse_args("NodePolicy", NodePolicyArgs, raw.get("NodePolicy")))
    gpu_fit = GpuFit(parse_args("GpuFit", GpuFitArgs, raw.get("GpuFit")))
    locality = GangLocalityScore(parse_args("GangLocality", GangLocalityArgs, raw.get("GangLocality")))
    weights = parse_args("weights", ScoreWeights, raw.get("weights"))
    pre_filter: list[PreFilterPlugin] = []
    reserve: list[ReservePlugin] = [CacheReserve(cache)]
    permit: list[PermitPlugin] = []
    if gangs:
        coscheduling = Coscheduling(
            registry, parse_args("Coscheduling", CoschedulingArgs, raw.get("Coscheduling"))
        )
        pre_filter.append(coscheduling)
        permit.append(coscheduling)
    model, mig = GpuModelFilter(), MigResourceFilter()
    pre_filter += [model, mig, gpu_fit, locality]
    score = [
        WeightedScore(node_policy, weights.NodePolicy),
        WeightedScore(GpuTopologyScore(), weights.GpuTopology),
        WeightedScore(locality, weights.GangLocality),
    ]
    if fragmentation is not None:
        score.append(WeightedScore(fragmentation, weights.Fragmentation))
    return Profile(
        pre_filter=pre_filter,
        filter=[NodeConstraints(), model, mig, NodeResourcesFit(), gpu_fit],
        score=score,
        reserve=reserve,
        permit=permit,
        bind=[DefaultBinder(cache, port)],
    )
