"""The pod as the framework schedules it: a resource request, constraints and placement policies."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType

from tessera.cluster.domain.affinity import NodeSelectorTerm
from tessera.cluster.domain.node import Toleration
from tessera.scheduler.domain.snapshot import MILLI_PER_GPU

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


class InvalidSpec(ValueError):
    """Bad input; the message names the field and the reason."""

    def __init__(self, field_name: str, reason: str) -> None:
        super().__init__(f"{field_name}: {reason}")
        self.field = field_name
        self.reason = reason


class Policy(StrEnum):
    """Binpack fills what is already in use; spread goes where most is free."""

    BINPACK = "binpack"
    SPREAD = "spread"


class JobClass(StrEnum):
    """Job classes with a known-good placement (HAMi's best practice)."""

    # Spread across nodes, so one node failing takes out as few replicas as possible.
    HIGH_QOS = "high_qos"
    # Pack small jobs into shared GPUs, leaving whole GPUs and nodes free.
    SMALL = "small"
    # Keep the job on one node for fast interconnect, but spread it over that node's GPUs.
    TIGHTLY_COUPLED = "tightly_coupled"


# (node policy, GPU policy) per job class.
JOB_CLASS_POLICIES: dict[JobClass, tuple[Policy, Policy]] = {
    JobClass.HIGH_QOS: (Policy.SPREAD, Policy.BINPACK),
    JobClass.SMALL: (Policy.BINPACK, Policy.BINPACK),
    JobClass.TIGHTLY_COUPLED: (Policy.BINPACK, Policy.SPREAD),
}


@dataclass(frozen=True, slots=True)
class PodSpec:
    """One pod of a gang. ``gpu_milli`` < 1000 with ``gpu_count`` 1 asks for a share of one GPU.

    ``node_policy`` and ``gpu_policy`` are per job; ``None`` leaves the choice to the plugin's
    configured default (the queue's policy).
    """

    name: str
    gang: str
    gpu_count: int = 0
    gpu_milli: int = MILLI_PER_GPU
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: frozenset[str] = frozenset()
    mig: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    node_policy: Policy | None = None
    gpu_policy: Policy | None = None
    #: the pod's ``nodeSelector``, sorted (key, value) pairs: a node must carry every one
    node_selector: tuple[tuple[str, str], ...] = ()
    #: the pod's tolerations: a node's NoSchedule and NoExecute taints must each be tolerated
    tolerations: tuple[Toleration, ...] = ()
    #: required node affinity: a node must match one of these nodeSelectorTerms (none: any node)
    node_affinity: tuple[NodeSelectorTerm, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidSpec("pod.name", "must not be empty")
        if not self.gang:
            raise InvalidSpec(f"pod {self.name}.gang", "must not be empty")
        if self.gpu_count < 0:
            raise InvalidSpec(f"pod {self.name}.gpu_count", f"must be >= 0, got {self.gpu_count}")
        if not 0 < self.gpu_milli <= MILLI_PER_GPU:
            raise InvalidSpec(
                f"pod {self.name}.gpu_milli", f"must be in 1..{MILLI_PER_GPU}, got {self.gpu_milli}"
            )
        if self.gpu_milli < MILLI_PER_GPU and self.gpu_count != 1:
            raise InvalidSpec(f"pod {self.name}.gpu_milli", "a GPU share needs gpu_count == 1")
        for name, value in (("cpu_milli", self.cpu_milli), ("memory_mib", self.memory_mib)):
            if value < 0:
                raise InvalidSpec(f"pod {self.name}.{name}", f"must be >= 0, got {value}")
        for profile, count in self.mig.items():
            if count <= 0:
                raise InvalidSpec(f"pod {self.name}.mig[{profile!r}]", f"must be >= 1, got {count}")

    def for_job_class(self, job_class: JobClass) -> PodSpec:
        """This pod with the node and GPU policies of ``job_class``."""
        node_policy, gpu_policy = JOB_CLASS_POLICIES[job_class]
        return replace(self, node_policy=node_policy, gpu_policy=gpu_policy)

    @property
    def fractional(self) -> bool:
        return self.gpu_count == 1 and self.gpu_milli < MILLI_PER_GPU

    @property
    def gpu_milli_total(self) -> int:
        return self.gpu_count * self.gpu_milli

    @classmethod
    def from_resources(cls, name: str, gang: str, requests: Mapping[str, int], **kwargs: object) -> PodSpec:
        """From a container's extended resources: ``nvidia.com/gpu`` and ``nvidia.com/mig-<profile>``."""
        gpus = 0
        mig: dict[str, int] = {}
        for resource, quantity in requests.items():
            if resource == GPU_RESOURCE:
                gpus = quantity
            elif resource.startswith(MIG_RESOURCE_PREFIX):
                profile = resource.removeprefix(MIG_RESOURCE_PREFIX)
                if not profile:
                    raise InvalidSpec(f"requests[{resource!r}]", "names no MIG profile")
                mig[profile] = quantity
            else:
                raise InvalidSpec(f"requests[{resource!r}]", "not a GPU resource this scheduler handles")
        return cls(name=name, gang=gang, gpu_count=gpus, mig=MappingProxyType(mig), **kwargs)  # type: ignore[arg-type]
