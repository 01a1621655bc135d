"""Value types of placement: what a pod asks for, what a node offers, where a pod goes."""

from __future__ import annotations

from dataclasses import dataclass

MILLI_PER_GPU = 1000


class PlacementInputError(ValueError):
    """A pod or node description that placement cannot work with; the message names the field."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node: its CPU, memory and `gpu_count` devices of one `model`."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    model: str

    def __post_init__(self) -> None:
        for field, value in (
            ("cpu_milli", self.cpu_milli),
            ("memory_mib", self.memory_mib),
            ("gpu_count", self.gpu_count),
        ):
            if value < 0:
                raise PlacementInputError(f"node {self.name!r}: {field} must be >= 0, got {value}")


@dataclass(frozen=True, slots=True)
class PodShape:
    """What one pod requests.

    `num_gpu` GPUs of `gpu_milli` each. A pod with one GPU and `gpu_milli` < 1000 shares a GPU;
    a pod with more than one GPU takes whole, fully idle GPUs. `gpu_models` lists the allowed
    GPU models; empty means any model.
    """

    cpu_milli: int
    memory_mib: int
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_models: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.cpu_milli < 0:
            raise PlacementInputError(f"cpu_milli must be >= 0, got {self.cpu_milli}")
        if self.memory_mib < 0:
            raise PlacementInputError(f"memory_mib must be >= 0, got {self.memory_mib}")
        if self.num_gpu < 0:
            raise PlacementInputError(f"num_gpu must be >= 0, got {self.num_gpu}")
        if self.num_gpu == 0 and self.gpu_milli != 0:
            raise PlacementInputError(f"gpu_milli must be 0 when num_gpu is 0, got {self.gpu_milli}")
        if self.num_gpu > 0 and not 0 < self.gpu_milli <= MILLI_PER_GPU:
            raise PlacementInputError(
                f"gpu_milli must be in 1..{MILLI_PER_GPU} when num_gpu > 0, got {self.gpu_milli}"
            )
        if self.num_gpu > 1 and self.gpu_milli != MILLI_PER_GPU:
            raise PlacementInputError(
                f"gpu_milli must be {MILLI_PER_GPU} when num_gpu > 1 (multi-GPU pods take whole GPUs), "
                f"got {self.gpu_milli}"
            )

    @property
    def gpu_request_milli(self) -> int:
        """Total milli-GPU requested: g x k."""
        return self.num_gpu * self.gpu_milli

    @property
    def is_sharing(self) -> bool:
        """True for a pod that takes part of one GPU."""
        return self.num_gpu == 1 and self.gpu_milli < MILLI_PER_GPU


@dataclass(frozen=True, slots=True)
class Placement:
    """A decision: the node index in the cluster state and the GPU slots taken on it."""

    node: int
    gpus: tuple[int, ...] = ()
