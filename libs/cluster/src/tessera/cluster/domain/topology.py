"""How a node's GPUs are wired to each other, and the choice of the best-connected set of k GPUs.

The link kinds follow ``nvidia-smi topo -m``: NVLink (direct or through NVSwitch), a shared PCIe
switch (PIX/PXB), the host bridge within one NUMA node (PHB/NODE) and across NUMA nodes (SYS).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from math import comb

# Past this many candidate sets, best_gpu_set grows a set greedily instead of trying them all.
_EXHAUSTIVE_LIMIT = 5000
_MEMO_LIMIT = 4096


class Link(StrEnum):
    SELF = "X"
    NVLINK = "NV"
    PCIE_SWITCH = "PIX"
    PCIE_HOST = "PHB"
    CROSS_NUMA = "SYS"

    @property
    def cost(self) -> int:
        """Relative cost of a transfer over this link; lower is better."""
        return _LINK_COST[self]

    @classmethod
    def parse(cls, text: str) -> Link:
        """Read a cell of ``nvidia-smi topo -m`` (``X``, ``NV12``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``)."""
        cell = text.strip().upper()
        if cell == "X":
            return cls.SELF
        if cell.startswith("NV"):
            return cls.NVLINK
        if cell in ("PIX", "PXB"):
            return cls.PCIE_SWITCH
        if cell in ("PHB", "NODE"):
            return cls.PCIE_HOST
        if cell in ("SYS", "SOC"):
            return cls.CROSS_NUMA
        raise ValueError(f"topology cell: unknown link kind {text!r}")


_LINK_COST: dict[Link, int] = {
    Link.SELF: 0,
    Link.NVLINK: 1,
    Link.PCIE_SWITCH: 4,
    Link.PCIE_HOST: 8,
    Link.CROSS_NUMA: 16,
}


@dataclass(frozen=True, slots=True)
class InterconnectMatrix:
    """A symmetric n-by-n matrix of links between the GPUs of one node, indexed by GPU index."""

    links: tuple[tuple[Link, ...], ...]
    _costs: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    _memo: dict[tuple[int, tuple[int, ...]], tuple[int, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        size = len(self.links)
        for i, row in enumerate(self.links):
            if len(row) != size:
                raise ValueError(f"interconnect.links[{i}]: expected {size} columns, got {len(row)}")
            if row[i] is not Link.SELF:
                raise ValueError(f"interconnect.links[{i}][{i}]: the diagonal must be {Link.SELF.value!r}")
            for j, link in enumerate(row):
                if j != i and link is Link.SELF:
                    raise ValueError(f"interconnect.links[{i}][{j}]: only the diagonal may be 'X'")
                if self.links[j][i] is not link:
                    raise ValueError(f"interconnect.links[{i}][{j}]: matrix is not symmetric")
        object.__setattr__(self, "_costs", tuple(tuple(link.cost for link in row) for row in self.links))
        # Schedulers ask the same question of the same node over and over: remember the answers.
        object.__setattr__(self, "_memo", {})

    @property
    def size(self) -> int:
        return len(self.links)

    def link(self, a: int, b: int) -> Link:
        return self.links[a][b]

    @classmethod
    def uniform(cls, size: int, link: Link) -> InterconnectMatrix:
        return cls(tuple(tuple(Link.SELF if i == j else link for j in range(size)) for i in range(size)))

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[str]]) -> InterconnectMatrix:
        """Build from the GPU-to-GPU cells of ``nvidia-smi topo -m``, one row of strings per GPU."""
        return cls(tuple(tuple(Link.parse(cell) for cell in row) for row in rows))

    def set_cost(self, gpus: Iterable[int]) -> tuple[int, int]:
        """(worst pairwise link cost, total pairwise cost) of a GPU set; lower is better."""
        costs = self._costs
        worst = 0
        total = 0
        for a, b in itertools.combinations(list(gpus), 2):
            cost = costs[a][b]
            total += cost
            if cost > worst:
                worst = cost
        return worst, total

    def best_gpu_set(self, k: int, candidates: Iterable[int] | None = None) -> tuple[int, ...] | None:
        """The best-connected set of ``k`` GPUs among ``candidates`` (default: all), or None if too few.

        Sets are ranked by their worst pairwise link first (a ring all-reduce runs at the speed of
        its slowest hop), then by their total link cost, then by lowest indices for determinism.
        """
        pool = sorted(set(range(self.size) if candidates is None else candidates))
        for index in pool:
            if not 0 <= index < self.size:
                raise ValueError(f"candidates: GPU index {index} is outside the {self.size}-GPU matrix")
        if k <= 0:
            raise ValueError(f"k: must be >= 1, got {k}")
        if k > len(pool):
            return None
        if k == 1 or k == len(pool):
            return tuple(pool[:k])
        memo_key = (k, tuple(pool))
        cached = self._memo.get(memo_key)
        if cached is not None:
            return cached
        if len({self._costs[a][b] for a, b in itertools.combinations(pool, 2)}) == 1:
            chosen = tuple(pool[:k])  # every pair is alike (an NVSwitch board): any k will do
        elif comb(len(pool), k) <= _EXHAUSTIVE_LIMIT:
            chosen = min(itertools.combinations(pool, k), key=lambda combo: (self.set_cost(combo), combo))
        else:
            chosen = self._greedy_set(k, pool)
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[memo_key] = chosen
        return chosen

    def _greedy_set(self, k: int, pool: list[int]) -> tuple[int, ...]:
        """Grow a set from each seed, adding the GPU that raises (worst, total) least; keep the best."""
        costs = self._costs
        best: tuple[tuple[int, int], tuple[int, ...]] | None = None
        for seed in pool:
            chosen = [seed]
            worst, total = 0, 0
            rest = [g for g in pool if g != seed]
            while len(chosen) < k:
                step = min(
                    (max(worst, *(costs[g][c] for c in chosen)), total + sum(costs[g][c] for c in chosen), g)
                    for g in rest
                )
                worst, total, nxt = step
                chosen.append(nxt)
                rest.remove(nxt)
            key = ((worst, total), tuple(sorted(chosen)))
            if best is None or key < best:
                best = key
        assert best is not None
        return best[1]
