"""Who uses a GPU: each reading split among the containers that hold the GPU. Pure.

The kubelet's PodResources API says which container holds which device (`DeviceGrant`): a whole GPU
(`nvidia.com/gpu`, device id `GPU-…`), one time-slicing replica of it (`GPU-…::<n>`), or a MIG
device (`nvidia.com/mig-<profile>`, device id `MIG-…`, whose GPU the source names). A GPU held by
one container is that container's alone. A GPU shared by several is split:

* by **SM** share when the source names the pod of every compute process on the GPU, each belongs to
  a holder, and the source sampled each process's SM utilisation (NVML's
  `nvmlDeviceGetProcessUtilization`): each holder's share of the GPU's use is its processes' share
  of the SM utilisation sampled;
* else by **memory** on the same condition without SM samples (NVML's
  `nvmlDeviceGetComputeRunningProcesses`, the devcluster's simulated processes): each holder's share
  of the GPU's use is its processes' share of the GPU memory in use;
* else by **requested** share: the milli-GPU the scheduler placed (`gang_placed`), else the MIG
  profile's compute slices, else equal replicas.

A GPU read per MIG instance (dcgm-exporter's `DCGM_FI_PROF_GR_ENGINE_ACTIVE` per `GPU_I_ID`) is not
split: each holder uses what the instance it holds used (`split_instances`), unknown when that
instance has no activity.

Every `Share` says which rule split it (`split`). See ADR 0016.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tessera.cluster.catalogue import model as catalogue_model
from tessera.cluster.catalogue import parse_profile_name

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
REPLICA_SEPARATOR = "::"
MILLI_PER_GPU = 1000

SPLIT_SM = "sm"
SPLIT_MEMORY = "memory"
SPLIT_REQUESTED = "requested"

#: the pod of GPU use that no holder accounts for (processes outside Kubernetes, gone pods)
UNKNOWN = "unknown"


class DeviceGrant(NamedTuple):
    """One device the kubelet gave one container (a `ContainerDevices` entry of PodResources `List`)."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


class Holder(NamedTuple):
    """One container's hold on one GPU. (Named tuples: built for every grant and reading, they cost a
    quarter of a frozen dataclass to make, and are as immutable.)"""

    namespace: str
    pod: str
    container: str
    gpu_uuid: str
    #: thousandths of the GPU it was given; None when only the split can tell (replicas)
    milli: int | None = None
    mig_profile: str | None = None
    replica: bool = False
    #: the MIG instance held (`MigInstance.instance_id`), when the source tells which
    mig_instance: str | None = None

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.pod}"


class MigInstance(NamedTuple):
    """One MIG instance of a GPU as the source read it (dcgm-exporter: a `GPU_I_ID` label set)."""

    #: its GPU instance id (`GPU_I_ID`)
    instance_id: str
    #: its profile (`3g.40gb`); "" when the source does not say
    profile: str
    #: the part of the time its engine was active, 0..1, relative to the instance; None: unknown
    active: float | None
    #: the pods the source says hold it (`namespace/name`)
    pods: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A compute process on a GPU, with the pod it runs in when the source can tell."""

    pid: int
    memory_mib: int
    pod: str | None = None  # namespace/name
    #: the container the process runs in, when the source can tell
    container: str | None = None
    #: the process's SM utilisation over the source's last sampling (percent of the GPU); None: unknown
    sm_pct: float | None = None


class Share(NamedTuple):
    """One container's part of one GPU reading: the GPUs it held and used, and its memory."""

    namespace: str
    pod: str
    container: str
    allocated_gpus: float
    used_gpus: float
    memory_mib: float
    split: str
    #: False when the holder's use is unknown (its MIG instance has no activity): `used_gpus` is 0.0
    #: and means nothing; its allocation, memory and cost still count
    known: bool = True

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.pod}"


def holders_from_grants(
    grants: Sequence[DeviceGrant],
    mig_parents: Mapping[str, str] | None = None,
    placed_milli: Callable[[str, str, str], int | None] | None = None,
) -> tuple[dict[str, list[Holder]], list[DeviceGrant]]:
    """GPU uuid -> its holders, and the GPU grants whose GPU is not known (a MIG device no reading
    names). `placed_milli(namespace, pod_name, gpu_uuid)` gives the share the scheduler placed, when
    it did."""
    by_gpu: dict[str, list[Holder]] = {}
    unresolved: list[DeviceGrant] = []
    parents = mig_parents or {}
    for g in grants:
        resource = g.resource
        if resource == GPU_RESOURCE:
            device = g.device_id
            cut = device.find(REPLICA_SEPARATOR)
            uuid = device if cut < 0 else device[:cut]
            milli = placed_milli(g.namespace, g.pod, uuid) if placed_milli is not None else None
            if milli is None and cut < 0:
                milli = MILLI_PER_GPU
            holder = Holder(g.namespace, g.pod, g.container, uuid, milli, None, cut >= 0)
        elif resource.startswith(MIG_RESOURCE_PREFIX):
            parent = parents.get(g.device_id)
            if parent is None:
                unresolved.append(g)
                continue
            profile = resource[len(MIG_RESOURCE_PREFIX) :]
            if profile.endswith(".me"):
                profile = profile[: -len(".me")] + "+me"
            holder = Holder(g.namespace, g.pod, g.container, parent, None, profile)
        else:
            continue
        held = by_gpu.get(holder.gpu_uuid)
        if held is None:
            by_gpu[holder.gpu_uuid] = [holder]
        else:
            held.append(holder)
    return by_gpu, unresolved


class HolderCache:
    """Each node's holders as last derived from its grants. While nothing starts or stops on a node,
    its kubelet answers the same grants round after round: when they, the MIG parents and the
    placements (`placements`, a number that changes whenever they do) are as last time, the node's
    holders are the same and are not derived again. The holders handed out are shared: read only."""

    def __init__(self) -> None:
        self._nodes: dict[
            str,
            tuple[tuple[DeviceGrant, ...], dict[str, str], int, dict[str, list[Holder]], list[DeviceGrant]],
        ] = {}

    def holders(
        self,
        node: str,
        grants: Sequence[DeviceGrant],
        mig_parents: Mapping[str, str],
        placed_milli: Callable[[str, str, str], int | None] | None,
        placements: int,
    ) -> tuple[dict[str, list[Holder]], list[DeviceGrant]]:
        key = tuple(grants)
        last = self._nodes.get(node)
        if last is not None and last[2] == placements and last[0] == key and last[1] == mig_parents:
            return last[3], last[4]
        by_gpu, unresolved = holders_from_grants(key, mig_parents, placed_milli)
        self._nodes[node] = (key, dict(mig_parents), placements, by_gpu, unresolved)
        return by_gpu, unresolved

    def keep_only(self, nodes: Collection[str]) -> None:
        """Forget the nodes not in `nodes` (gone, or their PodResources no longer answers)."""
        for node in [n for n in self._nodes if n not in nodes]:
            del self._nodes[node]


def holders_from_pods(gpu_uuid: str, pods: Sequence[str]) -> list[Holder]:
    """The fallback without PodResources: the source's own holders of a GPU (`namespace/name`, or
    `pid/<n>` on bare NVML), each with an equal requested share."""
    out = []
    for key in pods:
        namespace, _, name = key.partition("/")
        out.append(Holder(namespace, name, "", gpu_uuid, None, None, len(pods) > 1))
    return out


def holders_from_instances(gpu_uuid: str, instances: Sequence[MigInstance]) -> list[Holder]:
    """The fallback without PodResources on a GPU read per MIG instance: each pod the source says
    holds an instance holds that instance (its profile's slices), not an equal part of the GPU."""
    return [
        Holder(namespace, name, "", gpu_uuid, None, inst.profile, False, inst.instance_id)
        for inst in instances
        for namespace, _, name in (key.partition("/") for key in inst.pods)
    ]


def mig_fraction(model: str, profile: str) -> float:
    """The part of a GPU of `model` that a MIG instance of `profile` is: its compute slices over the
    GPU's (1/7 when the profile cannot be read; 7 slices when the model has no MIG geometry)."""
    try:
        geometry = catalogue_model(model).mig
    except (KeyError, ValueError):
        geometry = None
    try:
        compute, _, _ = parse_profile_name(profile)
    except ValueError:
        return 1.0 / 7
    total = geometry.compute_slices if geometry is not None else 7
    return compute / total


def requested_fractions(holders: Sequence[Holder], model: str = "") -> list[float]:
    """Each holder's share of the GPU it was given: its placed milli, its MIG profile's compute
    slices, or for replicas without a placement an equal part of what the others leave."""
    fractions: list[float | None] = []
    for h in holders:
        if h.mig_profile is not None:
            fractions.append(mig_fraction(model, h.mig_profile))
        elif h.milli is not None:
            fractions.append(h.milli / MILLI_PER_GPU)
        else:
            fractions.append(None)
    unknown = sum(1 for f in fractions if f is None)
    if unknown:
        known = sum(f for f in fractions if f is not None)
        rest = max(0.0, 1.0 - known) / unknown if known < 1.0 else 1.0 / (unknown + len(holders))
        return [rest if f is None else f for f in fractions]
    return [f for f in fractions if f is not None]


def split_reading(
    utilization_pct: float,
    memory_used_mib: float,
    holders: Sequence[Holder],
    processes: Sequence[GpuProcess] | None = None,
    model: str = "",
    mig_instances: Sequence[MigInstance] = (),
) -> list[Share]:
    """The reading of one GPU split among its holders (see the module's rules). Use that no holder
    accounts for (a GPU busy with nobody holding it) goes to the `unknown` pod. A GPU read per MIG
    instance (`mig_instances`) is split per instance (`split_instances`)."""
    used = max(0.0, min(100.0, utilization_pct)) / 100.0
    memory = max(0.0, memory_used_mib)
    if mig_instances and holders:
        return split_instances(memory, holders, mig_instances, model)
    if not holders:
        if used <= 0.0 and not processes:
            return []
        return [Share(UNKNOWN, UNKNOWN, "", 0.0, used, memory, SPLIT_REQUESTED)]
    if len(holders) == 1:
        h = holders[0]
        if h.mig_profile is not None:
            alone = mig_fraction(model, h.mig_profile)
        else:
            alone = h.milli / MILLI_PER_GPU if h.milli is not None else 1.0
        return [Share(h.namespace, h.pod, h.container, alone, used, memory, SPLIT_REQUESTED)]
    allocated = requested_fractions(holders, model)
    by_process = _by_holder(holders, processes)
    if by_process is not None:
        sm, mem = by_process
        if sm is not None:
            total_sm = sum(sm)
            return [
                Share(h.namespace, h.pod, h.container, a, used * u / total_sm, float(m), SPLIT_SM)
                for h, a, u, m in zip(holders, allocated, sm, mem, strict=True)
            ]
        if sum(mem) > 0:
            total = sum(mem)
            return [
                Share(h.namespace, h.pod, h.container, a, used * m / total, float(m), SPLIT_MEMORY)
                for h, a, m in zip(holders, allocated, mem, strict=True)
            ]
    weight = sum(allocated) or 1.0
    return [
        Share(h.namespace, h.pod, h.container, a, used * a / weight, memory * a / weight, SPLIT_REQUESTED)
        for h, a in zip(holders, allocated, strict=True)
    ]


def _by_holder(
    holders: Sequence[Holder], processes: Sequence[GpuProcess] | None
) -> tuple[list[float] | None, list[int]] | None:
    """Each holder's processes' SM utilisation (None unless every process was sampled and some used
    the SMs) and memory, when every process is known to belong to a holding pod. A pod holding the GPU
    in several containers is split by its processes' containers when each process names one of them;
    else such a GPU cannot be split by process."""
    if not processes:
        return None
    pods: dict[str, list[int]] = {}
    for i, h in enumerate(holders):
        pods.setdefault(h.pod_key, []).append(i)
    sm = [0.0] * len(holders)
    memory = [0] * len(holders)
    sampled = True
    for p in processes:
        found = pods.get(p.pod) if p.pod is not None else None
        if found is None:
            return None
        if len(found) > 1:
            named = [i for i in found if holders[i].container and holders[i].container == p.container]
            if len(named) != 1:
                return None
            found = named
        (index,) = found
        memory[index] += max(0, p.memory_mib)
        if p.sm_pct is None:
            sampled = False
        else:
            sm[index] += max(0.0, p.sm_pct)
    return (sm if sampled and sum(sm) > 0 else None), memory


def split_instances(
    memory_used_mib: float, holders: Sequence[Holder], instances: Sequence[MigInstance], model: str = ""
) -> list[Share]:
    """A GPU read per MIG instance: each holder uses what the instance it holds used (its activity
    times its part of the GPU, at most the holder's allocation), never its neighbours'. A holder whose
    instance has no activity, or cannot be told, has an unknown use (`Share.known`). The use of
    instances that no holder accounts for goes to the `unknown` pod, so the shares' use is the GPU's.
    Memory is split by allocation."""
    allocated = requested_fractions(holders, model)
    weight = sum(allocated) or 1.0
    memory = max(0.0, memory_used_mib)
    held: dict[int, list[int]] = {}
    for i, h in enumerate(holders):
        found = _instance_of(h, instances)
        if found is not None:
            held.setdefault(found, []).append(i)
    used = [0.0] * len(holders)
    known = [False] * len(holders)
    rest = 0.0
    for j, inst in enumerate(instances):
        if inst.active is None:
            continue
        use = max(0.0, min(1.0, inst.active)) * mig_fraction(model, inst.profile)
        mine = held.get(j)
        if not mine:
            rest += use
            continue
        total = sum(allocated[i] for i in mine)
        for i in mine:
            part = use * allocated[i] / total if total > 0 else use / len(mine)
            used[i] = min(allocated[i], part)
            known[i] = True
            rest += part - used[i]
    shares = [
        Share(h.namespace, h.pod, h.container, a, u, memory * a / weight, SPLIT_REQUESTED, k)
        for h, a, u, k in zip(holders, allocated, used, known, strict=True)
    ]
    if rest > 1e-12:
        shares.append(Share(UNKNOWN, UNKNOWN, "", 0.0, rest, 0.0, SPLIT_REQUESTED))
    return shares


def _instance_of(h: Holder, instances: Sequence[MigInstance]) -> int | None:
    """The index of the instance `h` holds: the one it names, else the one whose pods include its
    pod (of its profile when the pod holds several); None when it cannot be told."""
    if h.mig_profile is None:
        return None
    if h.mig_instance is not None:
        return next((j for j, inst in enumerate(instances) if inst.instance_id == h.mig_instance), None)
    found = [j for j, inst in enumerate(instances) if h.pod_key in inst.pods]
    if len(found) > 1:
        found = [j for j in found if instances[j].profile == h.mig_profile]
    return found[0] if len(found) == 1 else None
