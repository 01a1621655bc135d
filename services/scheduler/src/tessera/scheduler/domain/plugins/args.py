"""Typed, validated plugin arguments. A bad value fails with the plugin, the field and the reason."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tessera.scheduler.domain.framework.pod import Policy


class PluginArgsError(ValueError):
    """Raised for plugin arguments that do not validate; ``fields`` lists ``plugin.field`` paths."""

    def __init__(self, plugin: str, problems: list[tuple[str, str]]) -> None:
        self.fields = [f"{plugin}.{name}" for name, _ in problems]
        super().__init__("; ".join(f"{plugin}.{name}: {reason}" for name, reason in problems))


class PluginArgs(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NodePolicyArgs(PluginArgs):
    """Node-level placement for pods whose job sets none (the queue's policy)."""

    default_policy: Policy = Policy.BINPACK


class GpuFitArgs(PluginArgs):
    """GPU-level placement for pods whose job sets none, and how hard to look for the best-wired set."""

    default_policy: Policy = Policy.BINPACK
    exhaustive_limit: int = Field(
        default=5000, ge=1, description="past this many candidate sets, grow greedily"
    )


class GangLocalityArgs(PluginArgs):
    same_node_score: int = Field(default=100, ge=0, le=100)
    same_rack_score: int = Field(default=50, ge=0, le=100)


class CoschedulingArgs(PluginArgs):
    """How long reserved members wait in Permit for their gang's quorum before all are released."""

    permit_waiting_time_s: float = Field(default=60.0, gt=0, le=3600)


ArgsT = TypeVar("ArgsT", bound=PluginArgs)


def parse_args(plugin: str, model: type[ArgsT], raw: Mapping[str, Any] | None) -> ArgsT:
    try:
        return model.model_validate(dict(raw or {}))
    except ValidationError as error:
        problems = [
            (".".join(str(part) for part in issue["loc"]) or "args", issue["msg"]) for issue in error.errors()
        ]
        raise PluginArgsError(plugin, problems) from None
