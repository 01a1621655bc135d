"""A gang (pod group): its members, its quorum, its place in the queue."""

from __future__ import annotations

from dataclasses import dataclass

from tessera.scheduler.domain.framework.pod import InvalidSpec, PodSpec


@dataclass(frozen=True)
class GangSpec:
    """Members known so far, and ``min_available`` of them that must be placed together.

    ``min_available`` may exceed the members known yet (a controller creates pods one by one): the
    members present are reserved and wait in Permit until the quorum arrives or ``timeout_s`` ends.
    """

    name: str
    members: tuple[PodSpec, ...]
    min_available: int = 0
    priority: int = 0
    submitted_at: float = 0.0
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidSpec("gang.name", "must not be empty")
        if not self.members:
            raise InvalidSpec(f"gang {self.name}.members", "must not be empty")
        if self.min_available == 0:
            object.__setattr__(self, "min_available", len(self.members))
        if self.min_available < 1:
            raise InvalidSpec(f"gang {self.name}.min_available", f"must be >= 1, got {self.min_available}")
        names = set()
        for pod in self.members:
            if pod.gang != self.name:
                raise InvalidSpec(
                    f"gang {self.name}.members[{pod.name}].gang", f"is {pod.gang!r}, not {self.name!r}"
                )
            if pod.name in names:
                raise InvalidSpec(f"gang {self.name}.members", f"pod {pod.name!r} is listed twice")
            names.add(pod.name)
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise InvalidSpec(f"gang {self.name}.timeout_s", f"must be > 0, got {self.timeout_s}")

    @property
    def gpu_milli_total(self) -> int:
        return sum(pod.gpu_milli_total for pod in self.members)

    def member(self, pod: str) -> PodSpec:
        for member in self.members:
            if member.name == pod:
                return member
        raise KeyError(f"gang {self.name} has no member {pod!r}")
