"""Time-slicing replicas from fractional (milli) demand.

Each pod that shares a GPU takes one replica, so a GPU time-sliced into N replicas holds at most N
pods. On a GPU slicing time-sliced the scheduler places shares by free replicas alone (ADR 0021), so
N is also the bound on its oversubscription: the N chosen here by requested milli packs the shares
within 1000 milli a GPU, and `fit_by_usage` grows N only where measured use leaves room. The planner
packs the shares first-fit decreasing and picks the smallest N that needs no more GPUs than an
unlimited N would: small enough that few pods contend for one GPU, large enough that no GPU is left
short of replicas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.cluster.domain.gpu import MILLI_PER_GPU
from tessera.slicing.domain.layout import GpuLayout

DEFAULT_MAX_REPLICAS = 16


@dataclass(frozen=True, slots=True)
class TimeSlicingChoice:
    gpus: int
    replicas: int
    bins: tuple[tuple[int, ...], ...]

    @property
    def lower_bound(self) -> int:
        return math.ceil(sum(sum(b) for b in self.bins) / MILLI_PER_GPU)


def pack_shares(milli: Sequence[int], max_pods_per_gpu: int) -> list[list[int]]:
    """First-fit decreasing of shares into GPUs of 1000 milli holding at most ``max_pods_per_gpu`` pods."""
    if max_pods_per_gpu < 1:
        raise ValueError(f"max_pods_per_gpu: must be >= 1, got {max_pods_per_gpu}")
    for i, share in enumerate(milli):
        if not 1 <= share <= MILLI_PER_GPU:
            raise ValueError(f"milli[{i}]: must be within 1..{MILLI_PER_GPU}, got {share}")
    bins: list[list[int]] = []
    free: list[int] = []
    # Bins with room are few at any time: once a bin has less than the smallest share left or is
    # full of pods, it is dropped from the search.
    open_bins: list[int] = []
    smallest = min(milli, default=0)
    for share in sorted(milli, reverse=True):
        placed = False
        for position, b in enumerate(open_bins):
            if free[b] >= share:
                bins[b].append(share)
                free[b] -= share
                if free[b] < smallest or len(bins[b]) >= max_pods_per_gpu:
                    open_bins.pop(position)
                placed = True
                break
        if not placed:
            bins.append([share])
            free.append(MILLI_PER_GPU - share)
            if free[-1] >= smallest and max_pods_per_gpu > 1:
                open_bins.append(len(bins) - 1)
    return bins


def choose_replicas(milli: Sequence[int], max_replicas: int = DEFAULT_MAX_REPLICAS) -> TimeSlicingChoice:
    """GPUs and replicas for fractional pods (replicas >= 2; 0 GPUs when there is no demand)."""
    if max_replicas < 2:
        raise ValueError(f"max_replicas: must be >= 2, got {max_replicas}")
    if not milli:
        return TimeSlicingChoice(0, 2, ())
    target = len(pack_shares(milli, max_replicas))
    low, high = 2, max_replicas
    while low < high:  # the fewest replicas that still packs into `target` GPUs
        middle = (low + high) // 2
        if len(pack_shares(milli, middle)) <= target:
            high = middle
        else:
            low = middle + 1
    bins = pack_shares(milli, low)
    if len(bins) > target:  # first-fit is not monotone in the cap everywhere; keep the cap that worked
        low, bins = max_replicas, pack_shares(milli, max_replicas)
    return TimeSlicingChoice(len(bins), low, tuple(tuple(b) for b in bins))


def sharing_layout(bins: Sequence[Sequence[int]], replicas: int, mps_possible: bool) -> GpuLayout:
    """MPS where it serves ``bins`` (shares per GPU) as time-slicing with ``replicas`` would.

    The device plugin's MPS gives each of N replicas 1/N of the GPU's memory and SMs and enforces
    it per client, and runs the clients' kernels side by side rather than in turns; so it is chosen
    when every share fits 1000/N milli. N is time-slicing's replicas when the shares fit them, else
    the fewest the bins need; time-slicing otherwise, or when MPS is not possible on the node.
    """
    shares = [share for b in bins for share in b]
    if mps_possible and shares:
        largest = max(shares)
        for clients in (replicas, max(2, max(len(b) for b in bins))):
            if clients * largest <= MILLI_PER_GPU:
                return GpuLayout.mps(clients)
    return GpuLayout.time_slicing(replicas)


@dataclass(frozen=True, slots=True)
class UsagePacking:
    """Pods (by position in the input) per GPU, and how many had to leave the GPU they were on."""

    gpus: tuple[tuple[int, ...], ...]
    moves: int


def pack_by_usage(
    histories: Sequence[Sequence[float]],
    max_pods_per_gpu: int,
    overload_budget: float = 0.005,
    capacity_pct: float = 100.0,
    current: Sequence[int | None] | None = None,
    half_life_minutes: float | None = None,
) -> UsagePacking:
    """Pack pods onto time-sliced GPUs by their measured utilisation, minute by minute.

    ``histories`` are aligned utilisation series (percent, one per pod, over the same recent
    minutes). A set of pods fits one GPU when their summed utilisation exceeded ``capacity_pct``
    in at most ``overload_budget`` of those minutes: pods whose peaks do not coincide share a GPU,
    which sizing each pod by its own peak would forbid. ``current`` gives each pod's GPU now (any
    label, or None): pods stay together while they still fit, the rest are placed busiest first,
    and lightly loaded GPUs are emptied into others when every pod of theirs fits elsewhere.
    """
    if max_pods_per_gpu < 1:
        raise ValueError(f"max_pods_per_gpu: must be >= 1, got {max_pods_per_gpu}")
    if not 0 <= overload_budget < 1:
        raise ValueError(f"overload_budget: must be within [0, 1), got {overload_budget}")
    lengths = {len(h) for h in histories}
    if len(lengths) > 1:
        raise ValueError(f"histories: must all cover the same minutes, got lengths {sorted(lengths)}")
    if current is not None and len(current) != len(histories):
        raise ValueError(f"current: one entry per pod, got {len(current)} for {len(histories)} pods")
    minutes = lengths.pop() if lengths else 0
    # With a half-life, an old minute counts less than a recent one, so a busy spell that has passed
    # stops holding pods apart sooner, while a recent spike still does.
    if half_life_minutes is not None and half_life_minutes <= 0:
        raise ValueError(f"half_life_minutes: must be > 0, got {half_life_minutes}")
    age_weight = [
        0.5 ** ((minutes - 1 - i) / half_life_minutes) if half_life_minutes else 1.0 for i in range(minutes)
    ]
    allowed = overload_budget * sum(age_weight)
    bins: list[list[int]] = []
    sums: list[list[float]] = []

    def fits(b: int, pod: int) -> bool:
        if len(bins[b]) >= max_pods_per_gpu:
            return False
        over = 0.0
        for total, value, age in zip(sums[b], histories[pod], age_weight, strict=True):
            if total + value > capacity_pct:
                over += age
                if over > allowed:
                    return False
        return True

    def add(b: int, pod: int) -> None:
        bins[b].append(pod)
        sums[b] = [t + v for t, v in zip(sums[b], histories[pod], strict=True)]

    def new_bin() -> int:
        bins.append([])
        sums.append([0.0] * minutes)
        return len(bins) - 1

    weight = [max(h, default=0.0) + (sum(h) / minutes if minutes else 0.0) for h in histories]

    def snug(b: int, pod: int) -> tuple[float, float]:
        """How much the GPU's peak grows with the pod (least first: their peaks miss each other)."""
        grown = max((t + v for t, v in zip(sums[b], histories[pod], strict=True)), default=0.0)
        return grown - max(sums[b], default=0.0), -sum(sums[b])

    loose: list[int] = []
    moves = 0
    groups: dict[int | None, list[int]] = {}
    for pod, label in enumerate(current or [None] * len(histories)):
        groups.setdefault(label, []).append(pod)
    for label, pods in groups.items():
        if label is None:
            loose.extend(pods)
            continue
        b = new_bin()
        for pod in sorted(pods, key=lambda p: -weight[p]):
            if fits(b, pod):
                add(b, pod)
            else:
                loose.append(pod)
                moves += 1
    for pod in sorted(loose, key=lambda p: -weight[p]):
        candidates = [b for b in range(len(bins)) if fits(b, pod)]
        target = min(candidates, key=lambda b: snug(b, pod)) if candidates else new_bin()
        add(target, pod)
    # empty the lightest GPUs into the others where all their pods fit
    for b in sorted(range(len(bins)), key=lambda b: sum(sums[b])):
        if not bins[b]:
            continue
        others = [o for o in range(len(bins)) if o != b and bins[o]]
        saved = ([list(x) for x in bins], [list(x) for x in sums])
        placed = True
        for pod in sorted(bins[b], key=lambda p: -weight[p]):
            fitting = [o for o in others if fits(o, pod)]
            if not fitting:
                placed = False
                break
            add(min(fitting, key=lambda o: snug(o, pod)), pod)
        if placed:
            moves += sum(1 for p in bins[b] if current is not None and current[p] is not None)
            bins[b], sums[b] = [], [0.0] * minutes
        else:
            bins[:], sums[:] = saved
    return UsagePacking(tuple(tuple(sorted(b)) for b in bins if b), moves)


@dataclass(frozen=True, slots=True)
class PodUse:
    """A pod on a GPU as the planner sizes it: its requested milli, and its measured use per minute
    (`usage_history.UsageHistory.series`) or None when it has too little history."""

    pod: str
    milli: int
    history: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class UsageFit:
    """Pending shares that join a time-sliced node's GPUs by measured use, and the replicas it takes."""

    replicas: int  # the node's replicas: what its most loaded GPU still allows (never below held)
    placed: tuple[int, ...]  # milli of the pending shares placed
    running: int  # pods already on the GPUs
    measured: int  # of those, pods sized by their measured use (the rest by requested milli)


def fit_by_usage(
    gpus: Sequence[Sequence[PodUse]],
    shares: Sequence[int],
    max_replicas: int,
    overload_budget: float,
    half_life_minutes: float | None,
) -> UsageFit:
    """Place pending shares (milli, no history) beside the pods on each GPU, with `pack_by_usage` as
    the test of a GPU's pods fitting: pods with history count by their measured use, the others (the
    pending shares among them) by their requested milli, as a flat series. Pods stay on their GPU.

    The device plugin's replicas are node-wide and a scheduler fills any free replica whatever the
    pod's milli, so every GPU of the node may end up holding ``replicas`` pods: the replicas are the
    fewest pods any GPU can hold within the budget (each GPU tried alone against all the pending
    shares), never fewer than a GPU already holds (no running pod loses its slice)."""
    minutes = max((len(p.history) for g in gpus for p in g if p.history is not None), default=1)

    def series(pod: PodUse) -> list[float]:
        if pod.history is not None:
            return list(pod.history)
        return [min(100.0, pod.milli / 10.0)] * minutes

    def fill(members: Sequence[PodUse], left: list[int], limit: int) -> list[int]:
        """The pending shares (from ``left``, largest first) this GPU takes up to ``limit`` pods."""
        histories = [series(p) for p in members]
        taken: list[int] = []
        too_large = MILLI_PER_GPU + 1  # a share this large or larger did not fit this GPU
        for share in left:
            if len(histories) >= limit:
                break
            if share >= too_large:
                continue
            candidate = [*histories, series(PodUse("", share))]
            packed = pack_by_usage(
                candidate,
                max_replicas,
                overload_budget=overload_budget,
                current=[0] * len(candidate),
                half_life_minutes=half_life_minutes,
            )
            if len(packed.gpus) == 1:  # every pod stayed on the GPU: together they fit
                histories = candidate
                taken.append(share)
            else:
                too_large = share
        return taken

    pending = sorted(shares, reverse=True)
    held = max((len(g) for g in gpus), default=0)
    bound = min((len(g) + len(fill(g, pending, max_replicas)) for g in gpus), default=0)
    replicas = max(held, bound)
    placed: list[int] = []
    for members in gpus:
        for share in fill(members, pending, replicas):
            pending.remove(share)
            placed.append(share)
    return UsageFit(
        replicas=replicas,
        placed=tuple(placed),
        running=sum(len(g) for g in gpus),
        measured=sum(1 for g in gpus for p in g if p.history is not None),
    )
