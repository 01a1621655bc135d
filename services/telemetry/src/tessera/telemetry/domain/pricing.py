"""What GPU capacity costs: flavors (a GPU model, on-demand or spot) and their prices per GPU-hour,
and which flavor a node's GPUs belong to, from its labels. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from tessera.telemetry.domain.attribution import UNKNOWN


class CapacityType(StrEnum):
    ON_DEMAND = "on-demand"
    SPOT = "spot"


#: node labels that say a node is spot capacity, with the value that means spot
SPOT_LABELS: dict[str, tuple[str, ...]] = {
    "karpenter.sh/capacity-type": ("spot",),
    "eks.amazonaws.com/capacityType": ("SPOT",),
    "cloud.google.com/gke-spot": ("true",),
    "cloud.google.com/gke-preemptible": ("true",),
    "kubernetes.azure.com/scalesetpriority": ("spot",),
    "node.kubernetes.io/capacity-type": ("spot",),
}


def capacity_type_of(labels: Mapping[str, str]) -> CapacityType | None:
    """Spot or on-demand as the node's labels say (Karpenter, EKS, GKE, AKS), None when they do not."""
    for label, spot_values in SPOT_LABELS.items():
        value = labels.get(label)
        if value is not None:
            return CapacityType.SPOT if value in spot_values else CapacityType.ON_DEMAND
    return None


@dataclass(frozen=True, slots=True)
class Flavor:
    """A kind of GPU capacity and its price per GPU-hour, on-demand and spot."""

    name: str
    gpu_model: str | None = None
    capacity_type: CapacityType | None = None
    on_demand_per_gpu_hour: float = 0.0
    spot_per_gpu_hour: float | None = None

    def price(self, capacity: CapacityType) -> float:
        if capacity is CapacityType.SPOT and self.spot_per_gpu_hour is not None:
            return self.spot_per_gpu_hour
        return self.on_demand_per_gpu_hour


@dataclass(frozen=True, slots=True)
class Pricing:
    """The flavor a node's GPUs belong to and what one GPU-hour of it costs."""

    flavor: str
    capacity_type: CapacityType
    per_gpu_hour: float


@dataclass(frozen=True)
class PriceBook:
    flavors: tuple[Flavor, ...] = ()
    currency: str = "USD"

    def pricing(self, gpu_model: str, labels: Mapping[str, str] | None = None) -> Pricing:
        """The flavor of a node's GPUs: the first flavor of its model and capacity type (on-demand
        when its labels do not say), else of its model, else a flavor named after the model at no price."""
        labels = labels or {}
        capacity = capacity_type_of(labels)
        model = gpu_model.lower()
        candidates = [f for f in self.flavors if (f.gpu_model or f.name).lower() == model]
        wanted = (capacity, None) if capacity is not None else (None, CapacityType.ON_DEMAND)
        chosen = next((f for f in candidates if f.capacity_type in wanted), None)
        if chosen is None and candidates:
            chosen = candidates[0]
        if chosen is None:
            return Pricing(gpu_model or UNKNOWN, capacity or CapacityType.ON_DEMAND, 0.0)
        effective = capacity or chosen.capacity_type or CapacityType.ON_DEMAND
        return Pricing(chosen.name, effective, chosen.price(effective))
