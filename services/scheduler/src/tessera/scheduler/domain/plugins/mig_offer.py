"""Which MIG profiles the cluster's GPUs could ever offer: the profiles nodes advertise now, and every
profile of the catalogue geometry of each GPU model the nodes have (a GPU can be re-partitioned).
Pure; computed once per snapshot."""

from __future__ import annotations

from dataclasses import dataclass

from tessera.cluster.catalogue import model as catalogue_model
from tessera.cluster.catalogue import resolve_product
from tessera.cluster.conventions.names import GPU_PRODUCT_LABEL
from tessera.scheduler.domain.snapshot import Snapshot


@dataclass(frozen=True)
class MigOffer:
    #: profiles a node advertises or a GPU model's MIG geometry has
    profiles: frozenset[str]
    #: the GPU models of the cluster's nodes
    models: frozenset[str]
    #: some GPU model is known and every one is in the catalogue (else a profile cannot be ruled out)
    all_known: bool

    def never(self, profile: str) -> bool:
        """True only when the profile is certainly impossible: every model known, none offers it."""
        return self.all_known and profile not in self.profiles


def mig_offer(snapshot: Snapshot) -> MigOffer:
    found = snapshot.memo.get("mig_offer")
    if not isinstance(found, MigOffer):
        found = snapshot.memo["mig_offer"] = _compute(snapshot)
    return found


def _compute(snapshot: Snapshot) -> MigOffer:
    profiles: set[str] = set()
    models: set[str] = set()
    all_known = True
    for node in snapshot.nodes.values():
        profiles.update(p for p, n in node.mig_capacity.items() if n > 0)
        names = set(node.models)
        product = node.labels.get(GPU_PRODUCT_LABEL)
        if product:
            names.add(resolve_product(product).name)
        for name in names:
            gpu = catalogue_model(name)
            models.add(str(gpu.name))
            if not gpu.known:
                all_known = False
            elif gpu.mig is not None:
                profiles.update(p.name for p in gpu.mig.profiles)
    # with no GPU model known at all (nodes without GPUs or product labels), nothing can be ruled out
    return MigOffer(frozenset(profiles), frozenset(models), all_known and bool(models))
